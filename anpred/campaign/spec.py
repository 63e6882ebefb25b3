"""The campaign file (TOML, read with the standard library's ``tomllib``) and its expansion into
configurations.

A campaign file::

    [campaign]
    name = "zoo-nightly"
    retries = 2              # Ray retries of a task whose worker crashed, was killed or whose node died
    timeout = 600            # seconds per backend run (prepare + all samples), as `anpred test --timeout`
    memory_bound = 6         # GiB of RSS per backend worker, as `--memory-bound` (default: from each
                             # node's available memory, anpred.run.limits)
    history = "history.sqlite"   # relative to the output folder (default OUT/history.sqlite)
    batch = 8                # configurations per warm-worker batch task (default: anpred.campaign.warm.
                             # DEFAULT_BATCH or fewer to fill the CPUs; 0: one task per backend run)

    [defaults]               # options of every configuration (`anpred test`'s, by their Python names)
    samples = 2
    stages = 4
    imgsz = 320
    oracle = "consensus"     # consensus | both
    config = "oracle.toml"   # oracle settings, relative to the campaign file
    drill = false
    task = "detect"          # or "none", "module:function"

    [[models]]
    model = "yolov8n"        # a zoo name, an .onnx file (relative to the campaign file) or module:function
    name = "yolov8n-320"     # the label (default: the model text's stem)
    imgsz = 320              # any option of [defaults] may be overridden per model

    [backend_sets]           # name -> backends; every model runs with every set
    fp32 = ["ort", "openvino", "torch", "tf"]

    [inputs]                 # name -> options (`inputs`, `samples`, `seed`); default {"default": {}}
    default = {}
    random = { inputs = "random:normal:n=3" }

    [[versions]]             # optional: versions of a runtime, each its own wheel set
    package = "onnxruntime"  # the pip distribution
    versions = ["1.31.1", "1.32.0"]     # installed once each, `pip install --no-deps --target`
    backends = ["ort", "ort-fp16", "ort-int8"]  # the backends whose processes see it
    find_links = "wheels/"   # optional: a local wheel folder (then nothing is downloaded)
    # or environments that already exist (folders put first on the backends' PYTHONPATH):
    # paths = { "dev" = "/opt/ort-dev/site-packages" }

    [resources]              # Ray resources of one backend run (one task)
    cpus = 1
    memory_gb = 2
    [resources.backends.tvm]
    memory_gb = 4
    # gpus = 1 for a backend that asks for a GPU

Configurations: every model x backend set x input set x version combination (the product over the
``[[versions]]`` entries; without one, the installed libraries). Each has an id, readable and stable:
``<model>.<set>.<inputs>[.<package>-<version>]`` plus 8 hex digits of the sha256 of its canonical
JSON: the model's content (an .onnx file's sha256, a factory module's source sha256, a zoo name),
the backends, the options (paths inside the campaign folder relative to it) and the versions. An
edited option or model file gives a new configuration; a re-run skips only configurations whose
every part is unchanged; a campaign folder moved elsewhere keeps its ids.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anpred.campaign.tasks import import_paths
from anpred.compat import toml_reader
from anpred.errors import AnpredError

__all__ = ["Campaign", "Configuration", "VersionAxis", "load_campaign", "config_id", "TEST_OPTIONS"]

#: options of a configuration (``[defaults]``, per model, per input set): ``anpred.test``'s keywords
TEST_OPTIONS = (
    "inputs",
    "samples",
    "stages",
    "max_cut_width",
    "imgsz",
    "seed",
    "factory_kwargs",
    "oracle",
    "config",
    "bind",
    "drill",
    "task",
    "labels",
    "allow_incomplete",
)
#: default Ray resources of one backend run: one core (a 2-core machine runs two backends side by
#: side) and 2 GiB, about 3x the largest peak RSS of one backend process in the measured campaign
#: (docs/campaigns.md, 'Measured: figures behind defaults'). Ray reserves them logically: too
#: high runs fewer backends at once, too low lets them oversubscribe memory. Override in
#: ``[resources]`` (large inputs such as DocLayNet at 1024x1024 need more).
DEFAULT_RESOURCES = {"cpus": 1.0, "memory_gb": 2.0, "gpus": 0.0}


@dataclass
class VersionAxis:
    """One ``[[versions]]`` entry: a package, its versions (in the order given, oldest first) and the
    backends whose worker processes see it; ``paths``: version -> existing folder (no install)."""

    package: str
    versions: list[str]
    backends: list[str]
    find_links: str | None = None
    paths: dict[str, str] = field(default_factory=dict)


@dataclass
class Configuration:
    """One ``anpred test`` of a campaign.

    Attributes:
        id: folder name under ``OUT/configs`` (see the module docstring).
        model: the model text (zoo name, absolute .onnx path, module:function); ``label``: its name.
        backend_set: set name; ``backends``: its backends.
        inputs_name: input set name; ``options``: ``anpred.test`` keywords (TEST_OPTIONS).
        versions: package -> version for this configuration ({} for the installed libraries).
        resources: backend -> {"cpus", "memory_gb", "gpus"}.
        model_key: what identifies the model's content in the id (:func:`config_id`).
    """

    id: str
    model: str
    label: str
    backend_set: str
    backends: list[str]
    inputs_name: str
    options: dict[str, Any]
    versions: dict[str, str] = field(default_factory=dict)
    resources: dict[str, dict[str, float]] = field(default_factory=dict)
    model_key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "label": self.label,
            "backend_set": self.backend_set,
            "backends": self.backends,
            "inputs": self.inputs_name,
            "options": self.options,
            "versions": self.versions,
        }


@dataclass
class Campaign:
    """A parsed campaign file: ``configurations`` expanded, paths resolved against ``base`` (the
    file's folder)."""

    name: str
    path: Path
    base: Path
    retries: int
    timeout_s: float
    history: str
    configurations: list[Configuration]
    axes: list[VersionAxis]
    raw: dict[str, Any]
    memory_bound_gb: float | None = None
    #: configurations per warm-worker batch task (:mod:`anpred.campaign.warm`); None: its default; 0:
    #: every configuration's backends in single-backend run tasks
    batch: int | None = None

    def axis_for(self, backend: str) -> list[VersionAxis]:
        return [a for a in self.axes if backend in a.backends]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text).strip("-") or "x"


def _label(model: str) -> str:
    if ":" in model and not model.endswith(".onnx"):
        return model.rsplit(":", 1)[1]
    return Path(model).stem if model.endswith(".onnx") else model


#: the type each option must have (TOML values): checked when the file is read, not in a Ray task
_TYPES = {
    "inputs": str,
    "samples": int,
    "stages": int,
    "max_cut_width": int,
    "seed": int,
    "factory_kwargs": dict,
    "oracle": str,
    "config": str,
    "bind": (dict, list, str),
    "drill": bool,
    "task": str,
    "labels": str,
    "allow_incomplete": bool,
    "imgsz": (int, list),
}
#: the keys of the campaign file's tables
_TOP = {"campaign", "defaults", "models", "backend_sets", "inputs", "versions", "resources"}
_HEAD = {"name", "retries", "timeout", "history", "memory_bound", "batch"}


def _options(table: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(table) - set(TEST_OPTIONS) - {"model", "name"})
    if unknown:
        raise AnpredError(f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(TEST_OPTIONS)}")
    out = {k: v for k, v in table.items() if k in TEST_OPTIONS}
    for k, v in out.items():
        ok = isinstance(v, _TYPES[k]) and not (isinstance(v, bool) and _TYPES[k] is int)
        if k == "imgsz" and isinstance(v, list):
            ok = len(v) in (1, 2) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        if not ok:
            raise AnpredError(f"{where}: option {k} = {v!r} has the wrong type (expected {_TYPES[k]})")
    if out.get("oracle") not in (None, "consensus", "both", "threshold"):
        raise AnpredError(f"{where}: oracle must be consensus, both or threshold (got {out['oracle']!r})")
    return out


def _resolve_path(value: Any, base: Path, key: str) -> Any:
    """A file option relative to the campaign file, resolved; a file or folder that does not exist is
    an error now, not in a Ray task (``labels = "folders"`` and ``random:...`` inputs are no paths)."""
    if not isinstance(value, str) or not value or value.startswith("random:") or (key, value) == ("labels", "folders"):
        return value
    p = (base / value).resolve()
    if not p.exists():
        raise AnpredError(f"campaign option {key} = {value!r}: no such file or folder {p}")
    return str(p)


def _model_key(text: str) -> str:
    """What identifies the model's content in a configuration's id: an .onnx file's sha256 (its
    path does not matter: a moved campaign resumes, an edited file is a new configuration), a factory
    module's source sha256 with its ``module:function``, else the zoo name."""
    import importlib.util

    from anpred.onnx_io import sha256_file

    if text.endswith(".onnx"):
        return "onnx:" + sha256_file(Path(text))
    if ":" in text:
        mod = text.split(":", 1)[0]
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise AnpredError(
                f"factory {text}: no module {mod!r} on the path (the campaign's folder, the working folder, the venv)"
            )
        origin = getattr(spec, "origin", None)
        if origin and Path(origin).is_file():
            return f"factory:{text}:" + sha256_file(Path(origin))
    return text


def _model_text(model: str, base: Path) -> str:
    if model.endswith(".onnx"):
        p = (base / model).resolve()
        if not p.is_file():
            raise AnpredError(f"campaign model {model!r}: no such file {p}")
        return str(p)
    return model


def _resources(raw: dict[str, Any], backends: list[str]) -> dict[str, dict[str, float]]:
    """backend -> Ray resources: the defaults, ``[resources]``, ``[resources.backends.<b>]``; a
    backend class that needs GPUs (:attr:`anpred.backends.base.Backend.gpus`) gets at least those."""
    from anpred.backends import backend_class

    if not isinstance(raw, dict) or not isinstance(raw.get("backends", {}), dict):
        raise AnpredError("[resources] must be a table (cpus, memory_gb, gpus, backends.<name>)")
    per = raw.get("backends", {}) or {}
    unknown = sorted(set(raw) - set(DEFAULT_RESOURCES) - {"backends"})
    unknown += sorted(
        f"backends.{b}.{k}"
        for b, t in per.items()
        for k in (t if isinstance(t, dict) else {"?": 0})
        if k not in DEFAULT_RESOURCES
    )
    if unknown:
        raise AnpredError(f"[resources]: unknown key(s) {', '.join(unknown)}; known: cpus, memory_gb, gpus, backends")
    for k, v in [*raw.items(), *[(f"backends.{b}.{k}", v) for b, t in per.items() for k, v in t.items()]]:
        if k != "backends" and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
            raise AnpredError(f"[resources] {k} = {v!r}: a number >= 0 is needed")
    base = {**DEFAULT_RESOURCES, **{k: float(v) for k, v in raw.items() if k in DEFAULT_RESOURCES}}
    out = {}
    for b in backends:
        r = {**base, **{k: float(v) for k, v in (per.get(b) or {}).items()}}
        r["gpus"] = max(r["gpus"], float(getattr(backend_class(b), "gpus", 0.0)))
        out[b] = r
    return out


def _axes(raw: list[dict[str, Any]], base: Path) -> list[VersionAxis]:
    axes = []
    if not isinstance(raw, list) or not all(isinstance(v, dict) for v in raw):
        raise AnpredError("[[versions]] entries must be tables (package, versions, backends, ...)")
    for i, v in enumerate(raw):
        where = f"[[versions]] #{i + 1}"
        unknown = sorted(set(v) - {"package", "versions", "backends", "find_links", "paths"})
        if unknown:
            raise AnpredError(
                f"{where}: unknown key(s) {', '.join(unknown)}; known: package, versions, backends, find_links, paths"
            )
        if "package" not in v or not v.get("backends"):
            raise AnpredError(f"{where}: needs package = ... and backends = [...]")
        paths = {str(k): str((base / p).resolve()) for k, p in (v.get("paths") or {}).items()}
        versions = [str(x) for x in v.get("versions", [])] + [k for k in paths if k not in v.get("versions", [])]
        if not versions:
            raise AnpredError(f"{where}: needs versions = [...] or paths = {{...}}")
        fl = v.get("find_links")
        axes.append(
            VersionAxis(
                package=str(v["package"]),
                versions=versions,
                backends=list(v["backends"]),
                find_links=str((base / fl).resolve()) if fl else None,
                paths=paths,
            )
        )
    return axes


def config_id(
    label: str,
    set_name: str,
    inputs_name: str,
    model_key: str,
    backends: list[str],
    options: dict[str, Any],
    versions: dict[str, str],
    base: Path,
) -> str:
    """A configuration's id (module docstring): readable stem + 8 hex digits of the sha256 of the
    canonical JSON of the model's content key, backends, options (paths under ``base`` relative)
    and versions. The bisection's probes use it too, so a probe and the campaign's configuration of
    the same test share one result."""
    stem = ".".join(
        [_slug(label), _slug(set_name), _slug(inputs_name)] + [_slug(f"{p}-{v}") for p, v in versions.items()]
    )
    canon = json.dumps(
        {"model": model_key, "backends": backends, "options": _portable(options, base), "versions": versions},
        sort_keys=True,
        default=str,
    )
    return f"{stem}.{hashlib.sha256(canon.encode()).hexdigest()[:8]}"


def _portable(opts: dict[str, Any], base: Path) -> dict[str, Any]:
    """Options with paths inside the campaign's folder made relative (a moved campaign keeps its ids)."""
    out = {}
    for k, v in opts.items():
        if isinstance(v, str) and os.path.isabs(v):
            try:
                v = "./" + str(Path(v).relative_to(base))
            except ValueError:
                pass
        out[k] = v
    return out


def _campaign_table(raw: dict[str, Any], path: Path) -> dict[str, Any]:
    """The ``[campaign]`` table of the campaign file ``path`` (``raw``: its parsed TOML), after checking
    the tables' kinds and names and the ``[campaign]`` keys' names, types and ranges.

    Raises:
        AnpredError: an unknown table or ``[campaign]`` key, a table of the wrong kind, a key of the
            wrong type or out of range.
    """
    unknown = sorted(set(raw) - _TOP)
    if unknown:
        raise AnpredError(f"{path}: unknown table(s) {', '.join(unknown)}; known: {', '.join(sorted(_TOP))}")
    for table in ("campaign", "defaults", "backend_sets", "inputs", "resources"):
        if table in raw and not isinstance(raw[table], dict):
            raise AnpredError(f"{path}: [{table}] must be a table")
    if "models" in raw and not isinstance(raw["models"], list):
        raise AnpredError(f"{path}: models must be a list of tables: write [[models]], not [models]")
    if any(not isinstance(t, dict) for t in (raw.get("inputs") or {}).values()):
        raise AnpredError(f"{path}: each input set is a table, e.g. noise = {{ inputs = \"random:normal:n=3\" }}")
    head = raw.get("campaign", {})
    unknown = sorted(set(head) - _HEAD)
    if unknown:
        raise AnpredError(
            f"{path}: unknown key(s) in [campaign]: {', '.join(unknown)}; known: {', '.join(sorted(_HEAD))}"
        )
    for k, typ in (
        ("retries", int),
        ("timeout", (int, float)),
        ("name", str),
        ("history", str),
        ("memory_bound", (int, float)),
        ("batch", int),
    ):
        if k in head and (not isinstance(head[k], typ) or isinstance(head[k], bool)):
            raise AnpredError(f"{path}: [campaign] {k} = {head[k]!r} has the wrong type")
    if (
        int(head.get("retries", 2)) < 0
        or float(head.get("timeout", 600)) <= 0
        or float(head.get("memory_bound", 1)) <= 0
        or int(head.get("batch", 0)) < 0
    ):
        raise AnpredError(f"{path}: [campaign] retries and batch must be >= 0, timeout and memory_bound > 0")
    return head


def load_campaign(path: str | Path) -> Campaign:
    """Read and expand a campaign file (format: the module docstring).

    Raises:
        AnpredError: an unreadable file, invalid TOML, no models or no backend set, an unknown
            table, [campaign] key, option or resource key, an option of the wrong type, a backend set
            with fewer than two backends, a model file or an inputs/config/labels path that does
            not exist, two configurations with one id.
    """
    from anpred.pipeline import parse_backend_list

    path = Path(path).resolve()
    tomllib = toml_reader()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise AnpredError(f"cannot read campaign file {path}: {err.strerror or err}") from err
    except tomllib.TOMLDecodeError as err:
        raise AnpredError(f"{path} is not valid TOML: {err}") from err
    base = path.parent
    head = _campaign_table(raw, path)
    models = raw.get("models") or []
    sets = raw.get("backend_sets") or {}
    if not models:
        raise AnpredError(f"{path}: no [[models]]")
    if not sets:
        raise AnpredError(f"{path}: no [backend_sets]")
    defaults = _options(raw.get("defaults", {}), "[defaults]")
    input_sets = raw.get("inputs") or {"default": {}}
    axes = _axes(raw.get("versions") or [], base)
    configs: list[Configuration] = []
    for m in models:
        if isinstance(m, str):
            m = {"model": m}
        if "model" not in m:
            raise AnpredError(f"{path}: a [[models]] entry without model = ...")
        text = _model_text(str(m["model"]), base)
        label = str(m.get("name") or _label(str(m["model"])))
        with import_paths(list(dict.fromkeys([os.getcwd(), str(base)]))):  # the tasks' order (engine.py)
            key = _model_key(text)
        mopts = _options(m, f"model {label}")
        for set_name, backends in sets.items():
            names = parse_backend_list(backends if isinstance(backends, str) else ",".join(backends))
            if len(names) < 2:
                raise AnpredError(f"backend set {set_name!r}: a consensus needs at least two backends")
            for in_name, in_opts in input_sets.items():
                opts = {**defaults, **mopts, **_options(in_opts or {}, f"input set {in_name}")}
                opts = {
                    k: (_resolve_path(v, base, k) if k in ("inputs", "config", "labels") else v)
                    for k, v in opts.items()
                }
                applying = [a for a in axes if set(a.backends) & set(names)]
                for combo in itertools.product(*[a.versions for a in applying]) if applying else [()]:
                    versions = {a.package: v for a, v in zip(applying, combo)}
                    cid = config_id(label, set_name, in_name, key, names, opts, versions, base)
                    configs.append(
                        Configuration(
                            id=cid,
                            model=text,
                            label=label,
                            backend_set=set_name,
                            backends=names,
                            inputs_name=in_name,
                            options=opts,
                            versions=versions,
                            model_key=key,
                            resources=_resources(raw.get("resources", {}), names),
                        )
                    )
    ids = [c.id for c in configs]
    dups = sorted({i for i in ids if ids.count(i) > 1})
    if dups:
        raise AnpredError(f"{path}: configurations with the same id (repeated model/set/input names): {dups}")
    return Campaign(
        name=str(head.get("name") or path.stem),
        path=path,
        base=base,
        retries=int(head.get("retries", 2)),
        timeout_s=float(head.get("timeout", 600)),
        history=str(head.get("history", "history.sqlite")),
        configurations=configs,
        axes=axes,
        raw=raw,
        memory_bound_gb=float(head["memory_bound"]) if "memory_bound" in head else None,
        batch=int(head["batch"]) if "batch" in head else None,
    )
