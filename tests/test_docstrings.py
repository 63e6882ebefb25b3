"""Docstrings and comments say what and why, briefly; measurements and their history live in docs/
(issue 36). A finder, read from the sources with ``ast`` and ``tokenize``, looks in the docstrings and
comments of ``anpred``, ``passes``, ``exporters`` and ``models`` for measurement passages:

- a time or memory figure (``2.5 s``, ``19 MB``, ``0.63 GiB``) that is not a limit the code sets
  (``at most 32 MiB``, ``every 0.5 s``, ``a model over 2 GB``);
- a percentage or a speed-up ratio (``0.46 %``, ``4x faster``) that is not a limit or a parameter;
- "measured"/"measurement" with a figure beside it on the line (``Measured: ... 2.1x``, ``0.26 to 0.83``);
- a date;
- a reference to one of our issues (``issue 12``, ``#12``); an upstream tracker's (``owner/repo#N``)
  is a source and stays.

A pointer to docs/ carries no figure and is not a passage. A line that must keep a figure is listed in
:data:`ALLOWED` with the reason; a new passage anywhere else fails :func:`test_no_measurement_passages`.
Every pointer must name an existing page and section (:func:`test_pointers_name_existing_sections`), so
that a figure moved to docs/ stays findable.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("anpred", "passes", "exporters", "models")

_NUM = r"(?<![\w.-])\d+(?:\.\d+)?(?:e-?\d+)?(?:\s?(?:-|to)\s?\d+(?:\.\d+)?)?"
# a figure preceded by one of these is a limit or a parameter the code sets, not a measurement
_LIMIT = (
    r"(?i:(?<!stayed )(?<!well )(?:<=|<|at most|at least|up to|above|over|under|below|larger than|"
    r"more than|less than|"
    r"every|past|plus|limit|timeout|bound|cap|capped at|threshold|default)\s*(?:~|about\s+)?)"
)
_QUANTITY = {
    "time": _NUM + r"\s?(?:s|ms|us|µs|min|h|seconds?|minutes?|hours?)\b(?![-\w])",
    "memory": _NUM + r"\s?(?:GB|GiB|MB|MiB|KB|KiB|kB)\b",
    "percentage": _NUM + r"\s?%",
}
PATTERNS = {
    **{kind: re.compile(pattern) for kind, pattern in _QUANTITY.items()},
    # ``10 x the median`` (spaced) is a formula's factor, ``4x faster`` a measured ratio
    "ratio": re.compile(
        _NUM + r"(?:x|×)\s(?:faster|slower|less|more|as|their|the)\b|" + _NUM + r"\stimes\s(?:faster|slower|as)\b"
    ),
    "date": re.compile(
        r"\b20\d\d-[01]\d(?:-[0-3]\d)?\b|"
        r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? (?:\d{1,2}, )?20\d\d\b"
    ),
    "issue": re.compile(r"\bissues?\s\d+|(?<![\w/.-])#\d+\b", re.I),
    "measured": re.compile(
        r"\bmeasur(?:ed|ement)s?\b.*?(?<![\w.])"
        r"(?:\d+\.\d+(?:e-?\d+)?|\d+(?:\s?-|\s?to)\s?\d+|\d+(?:\.\d+)?x)\b|"
        r"(?<![\w.])\d+(?:\.\d+)?x\b.*\bmeasured\b",
        re.I,
    ),
}
# a library's version (``ONNX Runtime 1.32``, ``MNN 3.6.1``) is no figure
_VERSION = re.compile(
    r"\b\d+\.\d+\.\d+\b|\b(?:Runtime|OpenVINO|MNN|TVM|onnx|torch|PyTorch|TensorFlow|numpy|ncnn|pnnx|"
    r"onnx2tf|onnx2torch|onnxsim|LiteRT|ExecuTorch|onnxconverter-common|opset)\s\d+(?:\.\d+)?\b"
)
# an inline literal (``#1``, ``"6.0 GiB"``, an example of a report line) is what the code writes, and a
# pointer to docs/ (``docs/run.md, 'Measurements: page faults'``) is where the figure went: neither is one
_LITERAL = re.compile(r"``.*?``|docs/[\w./-]+\.md(?:[,:]?\s*(?:'[^']*'|\"[^\"]*\"))?")
_LIMITED = re.compile(_LIMIT + r"(?:" + "|".join(_QUANTITY.values()) + r")")

#: (path, text the line contains) -> why the figure stays in the code
ALLOWED: dict[tuple[str, str], str] = {
    (
        "anpred/campaign/spec.py",
        "2 GiB, about 3x the largest peak RSS",
    ): "the default and its margin over the measured peak, whose figure is in docs/campaigns.md",
    ("anpred/dashboard/site.py", "(1 % resolution"): "the resolution of the encoding's formula",
    ("anpred/defaults.py", "a tail of 1 % of the elements is seen"): "what the default quantile 0.99 means",
    ("anpred/inputs/__init__.py", "random crop of 50-100 %"): "a parameter of the seeded augmentation",
    (
        "anpred/judge/positions.py",
        "0.5 MB per anchor otherwise",
    ): "65,536 int64 positions: the size the line saves, its reason, by arithmetic",
    ("anpred/pipeline/stream.py", "(all backends together): 1 GiB"): "the default's value, with its reason",
    (
        "anpred/pipeline/stream.py",
        "no 30 s wait per worker",
    ): "the pool's own time limit (anpred.run.pool) the line skips",
    (
        "anpred/run/jobs.py",
        "A fixed 256 MiB mmap threshold and a 1 GiB trim threshold",
    ): "the settings the code makes (WORKER_MALLOC_TUNABLES)",
    ("anpred/run/streaming.py", "512 KiB of float64"): "the constant's size, by arithmetic, and why it is that size",
    ("models/documents.py", "margins 8 % of the width"): "a parameter of the synthetic page generator",
    ("models/documents.py", "(12 % instead of 20 % of the height)"): "a parameter of the synthetic page generator",
    ("models/nonimage.py", "30 ms attack"): "a parameter of the synthetic speech generator",
    ("models/nonimage.py", "0.15-0.3 s each"): "parameters of the synthetic speech generator",
    ("models/nonimage.py", "(0.5 s or more after the speech ended)"): "where the synthetic chunks are cut",
    ("models/yolo.py", "random crop of 50-90 %"): "a parameter of the seeded augmentation",
    ("anpred/backends/ncnn_pnnx.py", "spinning 20 ms (ncnn's default)"): "a library's default, not a measurement",
}

#: files other helpers are splitting while this finder was written (issue 36, issue 34, issue 37): their
#: passages move when they are merged; a listed file that has none left fails test_pending_is_current
PENDING: dict[str, str] = {}


def passages_in(text: str) -> list[str]:
    """The kinds of measurement passage (keys of :data:`PATTERNS`) one docstring or comment line holds."""
    kinds = []
    text = _VERSION.sub("V", _LITERAL.sub("L", text))
    for kind, pattern in PATTERNS.items():
        found = [m for m in pattern.finditer(text)]
        if kind in _QUANTITY:
            limited = {m.end() for m in _LIMITED.finditer(text)}
            found = [m for m in found if m.end() not in limited]
        if found:
            kinds.append(kind)
    return kinds


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`])|\n\s*\n")


def _blocks(path: Path) -> list[tuple[int, str]]:
    """``(first line, text)`` of every docstring and every run of comment lines of ``path``."""
    src = path.read_text()
    lines = src.splitlines()
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out.append((node.lineno, "\n".join(lines[node.lineno - 1 : node.end_lineno])))
    last = -1
    for t in tokenize.generate_tokens(io.StringIO(src).readline):
        if t.type == tokenize.COMMENT:
            text = t.string.lstrip("#:").strip()
            if out and t.start[0] == last + 1 and out[-1][0] < 0:
                out[-1] = (out[-1][0], out[-1][1] + "\n" + text)
            else:
                out.append((-t.start[0], text))
            last = t.start[0]
    return [(abs(n), text) for n, text in out]


def _sentences(first: int, block: str) -> list[tuple[int, str]]:
    """``(line, text with its whitespace collapsed)`` of each sentence of a block starting at line ``first``."""
    out, start = [], 0
    for m in [*_SENTENCE_END.finditer(block), None]:
        end = m.start() if m else len(block)
        out.append((first + block.count("\n", 0, start), " ".join(block[start:end].split())))
        start = m.end() if m else end
    return out


@functools.cache
def find_passages(root: Path = ROOT) -> tuple[tuple[str, int, tuple[str, ...], str], ...]:
    """``(path, line, kinds, sentence)`` of every measurement passage (a sentence of a docstring or
    comment holding one) in the packages."""
    found = []
    for top in TOPS:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for first, block in _blocks(path):
                for n, text in _sentences(first, block):
                    kinds = passages_in(text)
                    if kinds:
                        found.append((rel, n, tuple(kinds), text))
    return tuple(found)


def _allowed(rel: str, text: str) -> bool:
    return rel in PENDING or any(rel == p and s in text for p, s in ALLOWED)


def test_detector_finds_measurements_and_not_limits():
    for text in (
        "took 2.5 s per call",
        "0.63 GiB: tf on PP-OCRv4 rec",
        "median 0.46 %, max 2.0 %",
        "about 4x faster than decoding",
        "Measured: clean fp32 backends reach at most 2.1x their peers'",
        "(measured: 0.26 to 0.83 on",
        "on 2026-12-07",
        "a regression (issue 12)",
        "fixed in #31",
        "buffered writes cost 25 ms against 33 ms",
    ):
        assert passages_in(text), text
    for text in (
        "in seconds",
        "shape (1, 3, 640, 640), float32",
        "at most 32 MiB",
        "wait up to 30 s",
        "polls every 0.5 s",
        "a model over 2 GB must use external data",
        "microsoft/onnxruntime#18576",
        "measured on the run: the median of the population",
        "ONNX Runtime 1.32, measured against float64",
        "(docs/run.md, 'Measurements: page faults')",
    ):
        assert not passages_in(text), text


def test_no_measurement_passages():
    left = [
        f"{rel}:{n} [{', '.join(kinds)}] {text}" for rel, n, kinds, text in find_passages() if not _allowed(rel, text)
    ]
    assert not left, (
        "measurements belong in docs/ (a page's 'Measurements' section), the code keeps a pointer:\n" + "\n".join(left)
    )


def test_allowed_and_pending_are_current():
    found = find_passages()
    stale = [f"{p}: {s!r}" for p, s in ALLOWED if not any(rel == p and s in text for rel, _, _, text in found)]
    stale += [p for p in PENDING if not any(rel == p for rel, _, _, _ in found)]
    assert not stale, "no longer a passage, take it off the list: " + ", ".join(stale)
    assert all(reason.strip() for reason in [*ALLOWED.values(), *PENDING.values()])


# a pointer from the code to a section of docs/: ``docs/run.md, 'Measurements: page faults'`` or
# ``docs/oracle.md "Consensus"``; each part of the title (split at ": ") names a heading or a bold lead-in
_POINTER = re.compile(r"docs/([\w.-]+\.md),?\s*(?:'([^']+)'|\"([^\"]+)\")")


def pointers_in(text: str, docs: Path) -> list[str]:
    """The pointers of ``text`` whose page or section under ``docs`` does not exist."""
    broken = []
    for m in _POINTER.finditer(text):
        page = docs / m.group(1)
        title = m.group(2) or m.group(3)
        heads = (
            [ln.lower() for ln in page.read_text().splitlines() if ln.startswith(("#", "**"))] if page.exists() else []
        )
        if not all(any(part.strip().lower() in h for h in heads) for part in title.split(": ")):
            broken.append(m.group(0))
    return broken


def test_pointers_name_existing_sections(tmp_path):
    (tmp_path / "run.md").write_text("# Run\n\n## Measurements (cited by the code)\n\n### page faults\n")
    assert not pointers_in("(docs/run.md, 'Measurements: page faults')", tmp_path)
    assert pointers_in("(docs/run.md, 'Measurements: spinning')", tmp_path)
    assert pointers_in("(docs/task.md, 'Measurements')", tmp_path)  # no such page
    broken = []
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            for first, block in _blocks(path):
                text = " ".join(ln.strip().lstrip("#:").strip() for ln in block.splitlines())
                broken += [f"{path.relative_to(ROOT).as_posix()}:{first} {p}" for p in pointers_in(text, ROOT / "docs")]
    assert not broken, "pointers to a docs/ section that does not exist:\n" + "\n".join(broken)
