"""Campaigns on Ray (issue 21): a campaign of 3 models x 4 real backends on the embedded local Ray,
with Ray worker processes killed during the run (SIGKILL), then resumed.

The models: two seeded PyTorch CNNs (factories) and the Softplus CNN whose inputs around -15 OpenVINO
2026.4.1 computes wrong (docs/oracle.md), so one configuration has a real flagged backend and the
drill-down names its operator. Nothing is mocked: the kills are real signals to the Ray workers that
execute the backend runs (found by the pid file each run task writes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from anpred.errors import AnpredError

HERE = Path(__file__).resolve().parent

CAMPAIGN = """
[campaign]
name = "kill-test"
retries = 1
timeout = 300
# one Ray task per backend run: the kills target the task of one backend (batches: tests/test_campaign_warm.py)
batch = 0

[defaults]
samples = 2
stages = 3

[[models]]
model = "pipeline_factories:small_cnn"
name = "cnn8"

[[models]]
model = "pipeline_factories:small_cnn"
name = "cnn16"
factory_kwargs = { width = 16, seed = 1 }

[[models]]
model = "softplus.onnx"
stages = 7
drill = true

[backend_sets]
fp32 = ["ort", "openvino", "torch", "onnx-reference"]

[resources]
cpus = 1
memory_gb = 1
"""


def _campaign_dir(tmp: Path) -> Path:
    from pipeline_factories import softplus_onnx

    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copy(HERE / "pipeline_factories.py", tmp / "pipeline_factories.py")
    softplus_onnx(tmp / "softplus.onnx")
    (tmp / "campaign.toml").write_text(CAMPAIGN)
    return tmp


class Killer(threading.Thread):
    """Kill (SIGKILL) the Ray worker running ``backend`` of a configuration each time a new one starts,
    ``times`` times per configuration (pid files ``OUT/.work/<id>/runs/.<backend>.pid``).

    It must race (a kill lands only while the worker lives): the pid file is polled every 50 ms and the
    worker lives for seconds (it imports torch before its first sample), so a loaded machine slows the
    worker at least as much as this thread; a worker already gone is skipped (ProcessLookupError)."""

    def __init__(self, out: Path, plan: dict[str, int], backend: str):
        super().__init__(daemon=True)
        self.out, self.plan, self.backend = out, dict(plan), backend
        self.killed: dict[str, list[int]] = {k: [] for k in plan}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            for cid, times in self.plan.items():
                pidf = self.out / ".work" / cid / "runs" / f".{self.backend}.pid"
                if len(self.killed[cid]) >= times or not pidf.is_file():
                    continue
                try:
                    pid = int(pidf.read_text())
                except (OSError, ValueError):
                    continue
                if pid in self.killed[cid]:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed[cid].append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)


def _history(db: Path) -> list[tuple[str, str]]:
    con = sqlite3.connect(str(db))
    try:
        return con.execute(
            "SELECT runs.run_dir, verdicts.backend FROM verdicts JOIN runs ON runs.id = verdicts.run_id"
        ).fetchall()
    finally:
        con.close()


@pytest.mark.slow
def test_campaign_kill_and_resume(tmp_path):
    """3 models x 4 backends on the embedded Ray, retries = 1. The worker running cnn8's torch is
    killed once (retried: the configuration completes); the worker running cnn16's torch is killed
    twice (retries run out: the configuration fails with Ray's reason, the others go on). The
    history then holds one verdict row per (complete configuration, backend). A second run completes
    only the failed configuration (its finished backend runs reused) and skips the others."""
    import ray

    from anpred.campaign import load_campaign, run_campaign

    base = _campaign_dir(tmp_path / "c")
    campaign = load_campaign(base / "campaign.toml")
    assert len(campaign.configurations) == 3
    ids = {c.label: c.id for c in campaign.configurations}
    out = tmp_path / "out"
    killer = Killer(out, {ids["cnn8"]: 1, ids["cnn16"]: 2}, "torch")
    killer.start()
    try:
        res = run_campaign(campaign, out, num_cpus=2, progress=False)
    finally:
        killer.stop.set()
        killer.join()
    assert not ray.is_initialized()  # the embedded Ray is stopped
    assert len(killer.killed[ids["cnn8"]]) == 1 and len(killer.killed[ids["cnn16"]]) == 2
    states = {r["label"]: r for r in res.records}
    assert {k: v["state"] for k, v in states.items()} == {"cnn8": "complete", "cnn16": "failed", "softplus": "complete"}
    failed = states["cnn16"]
    assert failed["step"] == "run" and failed["reason"].startswith("torch: ")
    assert "died" in failed["reason"] or "Crashed" in failed["reason"], failed["reason"]
    assert (out / "failed" / f"{ids['cnn16']}.json").is_file()
    assert not (out / "configs" / ids["cnn16"]).exists()  # nothing half-written
    # the killed-and-retried configuration is complete with every backend run
    assert {b: r["run"] for b, r in states["cnn8"]["backends"].items()} == dict.fromkeys(
        ["ort", "openvino", "torch", "onnx-reference"], "ok"
    )
    # the real defect: openvino flagged on the Softplus CNN, the drill-down names the operator
    sp = states["softplus"]["backends"]
    assert sp["openvino"]["flagged"] and sp["openvino"]["culprit_op"] == "Softplus"
    assert not any(sp[b]["flagged"] for b in ("ort", "torch", "onnx-reference"))
    rows = _history(out / "history.sqlite")
    assert len(rows) == 8 and len(set(rows)) == 8
    # finished backend runs of the failed configuration are kept for the re-run
    kept = sorted(p.name for p in (out / ".work" / ids["cnn16"] / "runs").iterdir() if not p.name.startswith("."))
    assert kept == ["onnx-reference", "openvino", "ort"]
    summary = (out / "summary.txt").read_text()
    assert "FAILED (run)" in summary and "FLAGGED s" in summary
    assert "index.html" in os.listdir(out)

    res2 = run_campaign(load_campaign(base / "campaign.toml"), out, num_cpus=2, progress=False)
    assert res2.ran == [ids["cnn16"]] and sorted(res2.skipped) == sorted([ids["cnn8"], ids["softplus"]])
    assert all(r["state"] == "complete" for r in res2.records)
    assert not (out / "failed" / f"{ids['cnn16']}.json").exists()
    rows = _history(out / "history.sqlite")
    assert len(rows) == 12 and len(set(rows)) == 12  # one row per (configuration, backend)
    assert {Path(d).parent.name for d, _ in rows} == set(ids.values())
    assert res2.exit_code == 1  # openvino is flagged on the Softplus CNN
    assert not (out / ".work").exists()
    assert not list(out.glob("configs/*/run/.*.pid"))
    # the output folder moved elsewhere: it resumes (nothing to run), the history gets no duplicate
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    res3 = run_campaign(load_campaign(base / "campaign.toml"), moved, num_cpus=2, progress=False)
    assert res3.ran == [] and len(res3.skipped) == 3
    assert len(_history(moved / "history.sqlite")) == 12
    assert "configs/" + ids["cnn8"] + "/report.html" in (moved / "index.html").read_text()


def test_campaign_file_errors(tmp_path):
    from anpred.campaign import load_campaign

    def load(text):
        p = tmp_path / "c.toml"
        p.write_text(text)
        return load_campaign(p)

    with pytest.raises(AnpredError, match="not valid TOML"):
        load("[campaign\n")
    with pytest.raises(AnpredError, match="no \\[\\[models\\]\\]"):
        load("[backend_sets]\na = ['ort', 'openvino']\n")
    with pytest.raises(AnpredError, match="unknown option.*imgsize"):
        load("[[models]]\nmodel = 'yolov8n'\nimgsize = 3\n[backend_sets]\na = ['ort', 'openvino']\n")
    with pytest.raises(AnpredError, match="one backend \\(ort\\) cannot be judged"):
        load("[[models]]\nmodel = 'yolov8n'\n[backend_sets]\na = ['ort']\n")
    with pytest.raises(AnpredError, match="no such file"):
        load("[[models]]\nmodel = 'missing.onnx'\n[backend_sets]\na = ['ort', 'openvino']\n")
    c = load(
        "[[models]]\nmodel = 'yolov8n'\nimgsz = 160\n[[models]]\nmodel = 'yolov5n'\n"
        "[backend_sets]\na = ['ort', 'openvino']\nb = ['ort', 'torch', 'tf']\n"
        "[inputs]\ndefault = {}\nrnd = { inputs = 'random:normal:n=2' }\n"
        "[[versions]]\npackage = 'onnxruntime'\nversions = ['1.31.1', '1.32.0']\nbackends = ['ort']\n"
    )
    assert len(c.configurations) == 2 * 2 * 2 * 2  # models x sets x inputs x versions
    first = c.configurations[0]
    assert first.id.startswith("yolov8n.a.default.onnxruntime-1.31.1.") and first.options["imgsz"] == 160
    assert first.resources["ort"] == {"cpus": 1.0, "memory_gb": 2.0, "gpus": 0.0}
    with pytest.raises(AnpredError, match="unknown table.*input"):
        load("[[models]]\nmodel = 'yolov8n'\n[backend_sets]\na = ['ort', 'openvino']\n[input]\nx = {}\n")
    with pytest.raises(AnpredError, match="unknown key.*retry"):
        load("[campaign]\nretry = 1\n[[models]]\nmodel = 'yolov8n'\n[backend_sets]\na = ['ort', 'openvino']\n")
    with pytest.raises(AnpredError, match="retries = 'abc' has the wrong type"):
        load("[campaign]\nretries = 'abc'\n[[models]]\nmodel = 'yolov8n'\n[backend_sets]\na = ['ort', 'openvino']\n")
    with pytest.raises(AnpredError, match="samples = 'two' has the wrong type"):
        load("[defaults]\nsamples = 'two'\n[[models]]\nmodel = 'yolov8n'\n[backend_sets]\na = ['ort', 'openvino']\n")
    with pytest.raises(AnpredError, match="inputs = 'nowhere/'.*no such file or folder"):
        load(
            "[[models]]\nmodel = 'yolov8n'\n[backend_sets]\na = ['ort', 'openvino']\n"
            "[inputs]\nmine = { inputs = 'nowhere/' }\n"
        )
    ok_head = "[[models]]\nmodel = 'yolov8n'\n[backend_sets]\na = ['ort', 'openvino']\n"
    for bad, msg in [
        ("[resources]\ncpus = 'two'\n", "cpus = 'two': a number"),
        ("[resources.backends.ort]\nmemgb = 3\n", "unknown key.*backends.ort.memgb"),
        (
            "[[versions]]\npackage = 'onnxruntime'\nbackends = ['ort']\nversions = ['1']\nfind_link = 'x'\n",
            "unknown key.*find_link",
        ),
        ("[inputs]\nx = 'random:normal:n=3'\n", "each input set is a table"),
    ]:
        with pytest.raises(AnpredError, match=msg):
            load(ok_head + bad)
    with pytest.raises(AnpredError, match="write \\[\\[models\\]\\], not \\[models\\]"):
        load("[models]\nmodel = 'yolov8n'\n[backend_sets]\na = ['ort', 'openvino']\n")
    with pytest.raises(AnpredError, match="\\[campaign\\] must be a table"):
        load("campaign = 3\n" + ok_head)
    with pytest.raises(AnpredError, match="no module 'nosuchmod'"):
        load("[[models]]\nmodel = 'nosuchmod:fn'\n[backend_sets]\na = ['ort', 'openvino']\n")
    # an edited option is a new configuration; the same file gives the same ids
    again = load("[[models]]\nmodel = 'yolov8n'\nimgsz = 320\n[backend_sets]\na = ['ort', 'openvino']\n")
    assert again.configurations[0].id.split(".")[-1] != first.id.split(".")[-1]


@pytest.mark.slow  # ~15 s (Ray and a copied ONNX Runtime)
def test_version_axis_runs_the_backend_on_that_environment(tmp_path):
    """A [[versions]] entry with an existing environment folder (here a copy of the installed
    onnxruntime package): the ort worker imports onnxruntime from that folder (recorded in its
    versions as "onnxruntime from"), openvino's does not; the summary names the version."""
    import onnxruntime

    from anpred.campaign import load_campaign, run_campaign

    base = _campaign_dir(tmp_path / "c")
    env = tmp_path / "env-ort-copy"
    src = Path(onnxruntime.__file__).parent
    shutil.copytree(src, env / "onnxruntime")
    for dist in src.parent.glob("onnxruntime-*.dist-info"):
        shutil.copytree(dist, env / dist.name)
    (base / "v.toml").write_text(
        '[campaign]\nname = "v"\n[defaults]\nsamples = 1\nstages = 2\n'
        '[[models]]\nmodel = "pipeline_factories:small_cnn"\nname = "cnn8"\n'
        '[backend_sets]\nfp32 = ["ort", "openvino"]\n'
        f'[[versions]]\npackage = "onnxruntime"\nbackends = ["ort"]\npaths = {{ "copy" = "{env}" }}\n'
    )
    res = run_campaign(load_campaign(base / "v.toml"), tmp_path / "out", num_cpus=2, progress=False)
    rec = res.records[0]
    assert rec["state"] == "complete" and rec["versions"] == {"onnxruntime": "copy"}
    assert rec["backends"]["ort"]["versions"]["onnxruntime from"] == str(env / "onnxruntime")
    assert "openvino from" not in rec["backends"]["openvino"]["versions"]
    assert rec["backends"]["ort"]["versions"]["onnxruntime"] == onnxruntime.__version__
    assert "onnxruntime copy" in (tmp_path / "out" / "index.html").read_text()


@pytest.mark.slow  # ~11 s: Ray clusters started and refused
def test_unmeetable_resources_and_unreachable_cluster_fail_with_a_reason(tmp_path):
    """A backend asking more memory than any node has fails its configuration with the reason
    (Ray would wait forever); an address where no cluster listens is refused before anything is
    written."""
    from anpred.campaign import load_campaign, run_campaign

    base = _campaign_dir(tmp_path / "c")
    (base / "r.toml").write_text(
        '[campaign]\nname = "r"\n[defaults]\nsamples = 1\nstages = 2\n'
        '[[models]]\nmodel = "softplus.onnx"\n'
        '[backend_sets]\nfp32 = ["ort", "openvino"]\n'
        '[resources.backends.openvino]\nmemory_gb = 100000\n'
    )
    campaign = load_campaign(base / "r.toml")
    t = time.perf_counter()
    res = run_campaign(campaign, tmp_path / "out", num_cpus=2, progress=False)
    assert time.perf_counter() - t < 600  # a hang guard (Ray would wait forever), not a speed bound
    rec = res.records[0]
    assert rec["state"] == "failed" and rec["step"] == "run"
    assert "openvino: no node of the Ray cluster can run it" in rec["reason"] and "100000.0 GiB" in rec["reason"]
    with pytest.raises(AnpredError, match="cannot reach a Ray cluster at 127.0.0.1:1"):
        run_campaign(campaign, tmp_path / "nowhere", address="127.0.0.1:1", progress=False)
    assert not (tmp_path / "nowhere").exists()


def test_prepare_version_offline_error(tmp_path):
    """A version that the local wheel folder does not hold: a clear error naming the package and
    version, and nothing left in the cache."""
    from anpred.campaign.envs import prepare_version

    (tmp_path / "wheels").mkdir()
    with pytest.raises(AnpredError, match=r"cannot install onnxruntime==0\.0\.1"):
        prepare_version("onnxruntime", "0.0.1", find_links=str(tmp_path / "wheels"))
    with pytest.raises(AnpredError, match="does not exist"):
        prepare_version("onnxruntime", "x", path=str(tmp_path / "missing"))


WHEELS = Path(__file__).resolve().parent.parent / ".venv" / "anpred-wheels"


@pytest.mark.slow
def test_bisect_names_the_onnxruntime_release_and_operator(tmp_path):
    """A real regression: ONNX Runtime 1.21.0 to 1.24.4 compute AveragePool with count_include_pad=1
    and end-only padding wrong (right in 1.20.1). Three releases installed by the campaign from the
    wheels scripts/setup.sh downloaded (pip --no-index --find-links), the campaign's summary lists the
    change between 1.20.1 and 1.21.0, and the bisection between 1.20.1 and 1.24.4 names 1.21.0, stage
    1 and the operator `avgpool` (AveragePool), with a repro that names the release's folder."""
    from pipeline_factories import avgpool_net_onnx

    from anpred.campaign import load_campaign, run_campaign
    from anpred.campaign.bisect import BisectRequest, bisect_versions

    assert sorted(p.name.split("-")[1] for p in WHEELS.glob("onnxruntime-*.whl")) == ["1.20.1", "1.21.0", "1.24.4"], (
        "scripts/setup.sh downloads these wheels"
    )
    avgpool_net_onnx(tmp_path / "avgpool_net.onnx")
    (tmp_path / "b.toml").write_text(
        '[campaign]\nname = "bisect"\n[defaults]\nsamples = 2\nstages = 3\n'
        '[[models]]\nmodel = "avgpool_net.onnx"\nname = "net"\n'
        '[backend_sets]\nfp32 = ["ort", "openvino", "onnx-reference"]\n'
        f'[[versions]]\npackage = "onnxruntime"\nbackends = ["ort"]\nversions = ["1.20.1", "1.21.0"]\n'
        f'find_links = "{WHEELS}"\n'
    )
    campaign = load_campaign(tmp_path / "b.toml")
    res = run_campaign(campaign, tmp_path / "out", num_cpus=2, progress=False)
    by_ver = {r["versions"]["onnxruntime"]: r for r in res.records}
    assert by_ver["1.20.1"]["backends"]["ort"]["verdict"] == "consistent"
    assert by_ver["1.21.0"]["backends"]["ort"]["flagged"] and by_ver["1.21.0"]["backends"]["ort"]["origin_stage"] == 1
    assert by_ver["1.21.0"]["backends"]["ort"]["versions"]["onnxruntime"] == "1.21.0"
    assert not by_ver["1.21.0"]["backends"]["openvino"]["flagged"]
    summary = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert [(c["from"], c["to"], c["backend"], c["before"]) for c in summary["version_changes"]] == [
        ("1.20.1", "1.21.0", "ort", "ok")
    ]

    b = bisect_versions(
        campaign,
        tmp_path / "bisect",
        BisectRequest(
            package="onnxruntime",
            model="net",
            backend="ort",
            good="1.20.1",
            bad="1.24.4",
            versions=["1.20.1", "1.20.5", "1.21.0", "1.24.4"],
        ),
        num_cpus=2,
        progress=False,
    )
    assert b["first_bad"] == "1.21.0" and b["last_good"] == "1.20.1"
    # 1.20.5 does not exist (not in the wheel folder): skipped with its reason, not taken for the change
    assert [(p["version"], p["standing"]) for p in b["probes"]] == [
        ("1.20.1", "ok"),
        ("1.24.4", "FLAGGED s1"),
        ("1.20.5", None),
        ("1.21.0", "FLAGGED s1"),
    ]
    assert "cannot install onnxruntime==1.20.5" in b["probes"][2]["skipped"]
    # a probe is the campaign's own configuration of that test (same id: its result is shared)
    assert b["probes"][0]["id"] == by_ver["1.20.1"]["id"] and b["probes"][3]["id"] == by_ver["1.21.0"]["id"]
    assert not (tmp_path / "bisect" / "campaign.json").exists()  # the probes leave OUT's summary alone
    assert b["origin_stage"] == 1 and b["culprit"] == {"node": "avgpool", "op_type": "AveragePool"}
    readme = next((tmp_path / "bisect" / "configs").glob("*.drill")) / "drill" / "repro" / "ort" / "README.md"
    assert "PYTHONPATH=" in readme.read_text() and "onnxruntime-1.21.0" in readme.read_text()


@pytest.mark.slow
def test_campaign_joins_an_existing_cluster_and_starts_its_own_without_address(tmp_path):
    """`--address`: a Ray cluster started apart (`ray start --head`; without token authentication,
    RAY_AUTH_MODE=disabled, as this process imported Ray without it) runs the campaign's tasks; the
    driver leaves the cluster running. Without `--address` the campaign starts its own embedded Ray
    even while that cluster runs (Ray's default joined it and refused ``num_cpus``: "When connecting to
    an existing cluster, num_cpus and num_gpus must not be provided"). The cluster is stopped alone
    (`ray start --block` ended by SIGTERM), not with `ray stop`, which stops every Ray on the machine."""
    import subprocess
    import sys

    import ray

    from anpred.campaign import load_campaign, run_campaign
    from anpred.cli import main

    base = _campaign_dir(tmp_path / "c")
    (base / "one.toml").write_text(
        '[campaign]\nname = "cluster"\n[defaults]\nsamples = 1\nstages = 2\n'
        '[[models]]\nmodel = "pipeline_factories:small_cnn"\nname = "cnn8"\n'
        '[backend_sets]\nfp32 = ["ort", "openvino", "onnx-reference"]\n'
    )
    port, client_port, agent_port = _free_ports(3)
    ray_cli = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    args = ["start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--include-dashboard=false"]
    # the two ports `ray start` otherwise takes fixed (10001, 52365): free ones, beside other Rays
    args += [f"--ray-client-server-port={client_port}", f"--dashboard-agent-listen-port={agent_port}"]
    cluster = subprocess.Popen(
        [ray_cli, *args, "--disable-usage-stats"],
        cwd=base,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for_port(port, cluster)
        rc = main(
            ["campaign", str(base / "one.toml"), "-o", str(tmp_path / "out"), "--address", f"127.0.0.1:{port}", "-q"]
        )
        rec = json.loads((tmp_path / "out" / "campaign.json").read_text())
        assert rc == 0 and rec["complete"] == 1
        assert rec["ray"]["resources"]["CPU"] == 2.0
        assert ray.is_initialized()  # joined, not owned: the cluster is left running
        ray.shutdown()
        res = run_campaign(load_campaign(base / "one.toml"), tmp_path / "own", num_cpus=1, progress=False)
        assert res.records[0]["state"] == "complete" and res.ray["resources"]["CPU"] == 1.0
        assert cluster.poll() is None and not ray.is_initialized()  # its own Ray stopped, the cluster runs
    finally:
        ray.shutdown()
        cluster.send_signal(signal.SIGTERM)
        cluster.wait(timeout=120)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports of 127.0.0.1 free now (the system's choice: bound together, then closed)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_for_port(port: int, proc, timeout_s: float = 120.0) -> None:
    """Until something listens on ``port`` of 127.0.0.1 (a hang guard, not a time bound)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"`ray start` exited {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"no Ray cluster listening on port {port} after {timeout_s} s")


def _build_once(args):
    """Worker of the cache test (a separate process): build one cache entry, counting builds."""
    root, counter = args
    os.environ["ANPRED_CACHE"] = root
    from anpred.cache import cached_dir

    def build(tmp):
        with open(counter, "a") as f:
            f.write("built\n")
        time.sleep(1.0)
        (tmp / "model.bin").write_bytes(b"x" * 10)

    return str(cached_dir("shared-test", "k1", build))


def test_conversion_cache_is_built_once_by_concurrent_processes(tmp_path):
    """Four processes ask for the same conversion at once (as backend runs of a campaign do): one
    builds it, the others wait for the file lock and use its result; no lock file among the entries."""
    import multiprocessing

    counter = tmp_path / "builds.txt"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        paths = pool.map(_build_once, [(str(tmp_path / "cache"), str(counter))] * 4)
    assert len(set(paths)) == 1 and (Path(paths[0]) / "model.bin").read_bytes() == b"x" * 10
    assert counter.read_text().count("built") == 1
    assert sorted(p.name for p in (tmp_path / "cache" / "shared-test").iterdir()) == ["k1"]
