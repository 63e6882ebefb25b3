"""The history database's schema and connections (stdlib ``sqlite3``): the tables of schema 3
(:mod:`anpred.report.history` describes them), the migration of a schema-1 or -2 database, and the
connections for writing (created and migrated) and reading (any schema 1 to 3, as is).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from anpred.errors import AnpredError


SCHEMA_VERSION = 3

_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT, run_dir TEXT, model TEXT, model_sha256 TEXT,
  machine TEXT, cpu TEXT, status TEXT, oracle TEXT, samples INTEGER, inputs TEXT, inputs_sha256 TEXT,
  report TEXT);
CREATE TABLE IF NOT EXISTS verdicts (
  run_id INTEGER REFERENCES runs(id), backend TEXT, family TEXT, precision TEXT, versions TEXT,
  flagged INTEGER, origin_anchor TEXT, origin_stage INTEGER, worst_anchor TEXT, worst_primary REAL,
  propagation TEXT, threshold_passed INTEGER, threshold_max_abs REAL, status TEXT, culprit TEXT, culprit_op TEXT);
CREATE TABLE IF NOT EXISTS cells (
  run_id INTEGER REFERENCES runs(id), backend TEXT, anchor TEXT, stage INTEGER, primary_stat REAL,
  flagged INTEGER, stats TEXT);
CREATE INDEX IF NOT EXISTS verdicts_backend ON verdicts(backend);
CREATE TABLE IF NOT EXISTS tasks (
  run_id INTEGER REFERENCES runs(id), backend TEXT, task TEXT, metric TEXT, value REAL);
"""

# schema 3: campaigns, their configurations and bisections (created on every write connection, so an
# older database gains them when appended to)
_DDL3 = """
CREATE TABLE IF NOT EXISTS campaigns (
  id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, folder TEXT, file TEXT, updated TEXT, axes TEXT,
  configurations INTEGER, complete INTEGER, failed INTEGER, UNIQUE (name, folder));
CREATE TABLE IF NOT EXISTS campaign_runs (
  campaign_id INTEGER REFERENCES campaigns(id), config_id TEXT, position INTEGER, label TEXT, backend_set TEXT,
  inputs TEXT, versions TEXT, state TEXT, reason TEXT, report TEXT, run_id INTEGER REFERENCES runs(id),
  UNIQUE (campaign_id, config_id));
CREATE TABLE IF NOT EXISTS bisections (
  id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT, campaign TEXT, folder TEXT, package TEXT, model TEXT,
  backend TEXT, good TEXT, bad TEXT, first_bad TEXT, last_good TEXT, standing_good TEXT, standing_first_bad TEXT,
  origin_stage INTEGER, origin_anchor TEXT, culprit TEXT, culprit_op TEXT, report TEXT, probes TEXT);
"""

#: columns added by a schema migration: (table, column, type), applied when missing
_ADDED = (
    ("runs", "inputs", "TEXT"),
    ("runs", "inputs_sha256", "TEXT"),
    ("verdicts", "status", "TEXT"),
    ("runs", "report", "TEXT"),
    ("verdicts", "culprit", "TEXT"),
    ("verdicts", "culprit_op", "TEXT"),
)


def connect(db: str | Path, create: bool) -> sqlite3.Connection:
    """A connection to the history ``db``: for writing (``create``: the file and the schema-3 tables are
    created, a schema-1 or -2 database is migrated) or for reading (the file must exist; not migrated).

    Raises:
        AnpredError: ``db`` (or, with ``create``, its folder) does not exist, or is not an anpred history
            database of schema 1 to 3.
    """
    p = Path(db)
    if not create and not p.is_file():
        raise AnpredError(f"{p}: no such history database")
    if create and not p.parent.is_dir():
        raise AnpredError(f"{p}: folder {p.parent} does not exist")
    try:
        con = sqlite3.connect(str(p))
        if create:
            con.executescript(_DDL)
            con.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            if con.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == str(SCHEMA_VERSION):
                con.executescript(_DDL3)
        ver = con.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if create and ver is not None and ver[0] in ("1", "2"):
            _migrate(con)
            ver = (str(SCHEMA_VERSION),)
    except sqlite3.DatabaseError as err:
        raise AnpredError(f"{p} is not an anpred history database: {err}") from err
    if ver is None or ver[0] not in ("1", "2", str(SCHEMA_VERSION)):
        con.close()
        raise AnpredError(f"{p}: history schema {ver[0] if ver else None!r} (expected {SCHEMA_VERSION})")
    return con


def _migrate(con: sqlite3.Connection) -> None:
    """Schema 1 or 2 -> 3, in one transaction: the missing columns of :data:`_ADDED` (1 -> 2: the
    input set identity; 2 -> 3: the report path and the culprit), then the schema-3 tables."""
    with con:
        for table, col, typ in _ADDED:
            if col not in columns(con, table):
                con.execute(f"ALTER TABLE {table} ADD COLUMN {col} {typ}")
        con.executescript(_DDL3)
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))


def columns(con: sqlite3.Connection, table: str) -> set[str]:
    """The column names of ``table`` (empty when the table does not exist)."""
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def create(db: str | Path) -> None:
    """Create the history ``db`` with the current schema (an existing one is migrated to it).

    Raises:
        AnpredError: ``db``'s folder does not exist, or ``db`` is not an anpred history database.
    """
    connect(db, create=True).close()


def open_history(db: str | Path) -> sqlite3.Connection:
    """A connection to the existing history ``db`` for reading, any schema 1 to 3 (not migrated: a
    column an older schema lacks is missing, :func:`columns` tells).

    Raises:
        AnpredError: ``db`` does not exist or is not an anpred history database.
    """
    return connect(db, create=False)
