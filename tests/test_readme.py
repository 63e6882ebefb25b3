"""README examples run as tests: the quick start has exactly two commands and .ci/run calls the
second one verbatim; the Python API example runs (a real zoo model on three backends); every command
of the CLI reference parses with the real parsers and names a registered subcommand; the fast ones run."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert m, f"README has no section '## {title}'"
    return m.group(1)


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _commands(block: str) -> list[str]:
    return [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_quick_start_has_two_commands_and_ci_runs_the_second():
    (block,) = _blocks(_section("Quick start"), "bash")
    cmds = _commands(block)
    assert len(cmds) == 2
    assert cmds[0].startswith("bash scripts/setup.sh && .venv/bin/anpred test demo")
    assert "--overwrite" in shlex.split(cmds[0])  # regression: a second run exited 2 (out/demo exists)
    # the demo's table labels the largest nRMSE as such (regression: it showed the cell nearest its threshold)
    demo = _section("Quick start")
    assert "worst nRMSE" not in demo and demo.count("consistent (max nRMSE") >= 10
    assert "benchmarks/bench_demo.py" in demo  # the timings come from the benchmark
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert cmds[1] in ci, "the README's test command must be the one .ci/run calls"
    assert (ROOT / "docs" / "images" / "demo-ppocr-heatmap.png").is_file()
    for link in re.findall(r"\]\(((?:docs|benchmarks)/[^)#]+)\)", README):
        assert (ROOT / link).exists(), f"README links to a missing file: {link}"


def test_python_api_example_runs(tmp_path, monkeypatch, capsys):
    (code,) = _blocks(_section("Python API"), "python")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "consistent"
    assert (tmp_path / "out" / "yolov8n-160" / "report.html").is_file()
    for b in ("ort", "openvino", "torch-native"):
        assert re.search(rf"^{b}\s+consistent", out, re.M), out


def _parsers():
    from anpred import cli

    main = cli.build_parser()
    mod = cli._module("instrument")
    inst = argparse.ArgumentParser(prog="anpred-instrument")
    mod.add_arguments(inst)
    return cli.COMMANDS, main, inst


def test_cli_reference_commands_parse_and_cover_every_subcommand():
    commands, main, inst = _parsers()
    (block,) = _blocks(_section("CLI reference by example"), "bash")
    used = set()
    for cmd in _commands(block):
        argv = shlex.split(cmd)
        if argv[0] == "anpred-instrument":
            inst.parse_args(argv[1:])
            used.add("instrument")
        else:
            assert argv[0] == "anpred" and argv[1] in commands, cmd
            args = main.parse_args(argv[1:])  # SystemExit (a failing test) on an unknown option
            assert args.command == argv[1]
            used.add(argv[1])
    assert used == set(commands), f"README's CLI reference misses {sorted(set(commands) - used)}"


@pytest.mark.parametrize("argv, expect", [(["zoo"], "yolov8n-doclaynet"), (["zoo", "yolov8n-doclaynet"], "trained")])
def test_fast_cli_examples_run(capsys, argv, expect):
    from anpred.cli import main

    assert main(argv) == 0
    assert expect in capsys.readouterr().out


def _ticked(text: str) -> list[str]:
    return re.findall(r"`([a-z0-9-]+)`", text)


def test_readme_defaults_match_the_code():
    """README's "Defaults of `anpred test`" names the code's default set, populations, full set,
    witness rule, samples and image size; the oracle summary's numbers are the config's."""
    from anpred.defaults import OracleConfig
    from anpred.pipeline.choices import (
        ALL_FP32,
        ARBITER_BACKEND,
        DEFAULT_IMGSZ,
        DEFAULT_SAMPLES,
        NATIVE_BACKEND,
        POPULATIONS,
        QUICK_FP32,
    )

    text = _section("Defaults of `anpred test`")
    items = [b for b in re.split(r"\n- ", "\n" + text.strip()) if b.strip()]

    def bullet(prefix: str) -> str:
        return next(b for b in items if b.lstrip("- ").startswith(prefix))

    backends = bullet("backends:")
    assert _ticked(backends.split("(")[0]) == list(QUICK_FP32)
    assert set(_ticked(backends)) - set(QUICK_FP32) == set(NATIVE_BACKEND.values())
    fp16, int8 = bullet("`--precision fp16`").split("; ")
    assert _ticked(fp16) == list(POPULATIONS["fp16"]) and _ticked(int8) == list(POPULATIONS["int8"])
    assert _ticked(bullet("`--all`")) == ["--all"] + list(ALL_FP32) + [ARBITER_BACKEND]
    cfg = OracleConfig()
    assert f"fewer than {cfg.min_voters} voting fp32 families" in bullet("witnesses:")
    inputs = bullet("inputs:")
    assert f"; {DEFAULT_SAMPLES} samples;" in inputs and f"sides {DEFAULT_IMGSZ} " in inputs
    oracle = " ".join(_section("The oracle in plain terms").split())
    assert f"`k` = {cfg.k['fp32']:g} times" in oracle
    assert float(re.search(r"fp32 floor \(([0-9.e-]+),", oracle).group(1)) == cfg.floor["fp32"]
    assert "at least three families" in oracle and cfg.min_voters == 3
    for word in ("precision population", "*budget*", "*implementation*", "witnesses", "float64"):
        assert word in oracle, word


def test_readme_shows_the_two_runtime_case_and_the_light_install():
    first = _section("Your model on your runtimes")
    assert "anpred test model.onnx -b ort,openvino" in first and "--no-witnesses" in first
    install = _section("Install")
    assert 'pip install ".[ort,openvino]"' in install and "bash scripts/setup.sh ort openvino" in install
    from anpred.compat import toml_reader

    extras = toml_reader().loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in extras:
        if extra != "test":
            assert f"`{extra}`" in install, extra
    assert "docs/demo.md" in README and (ROOT / "docs" / "demo.md").is_file()
