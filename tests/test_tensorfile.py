"""Run-store tensor files (safetensors written with direct I/O), the chunked per-sample statistics and
the backend workers' malloc settings (issue 3, run overhead)."""

from __future__ import annotations

import json
import math
import os

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy as stn

from anpred.manifest import AnchorManifest
from anpred.run import RunStore, StreamingStats, worker_malloc_tunables
from anpred.tensorfile import read_safetensors, storable, write_safetensors

from isa_reasons import SAME_DATA


def _arrays():
    rng = np.random.default_rng(7)
    return {
        "anchor/01/model.2": rng.standard_normal((1, 3, 5, 7)).astype(np.float32),
        "output/idx": np.arange(5, dtype=np.int64),
        "flag": np.array(True),
        "half": rng.random((2, 3)).astype(np.float16),
        "empty": np.zeros((0, 4), np.float32),
        "q": np.arange(9, dtype=np.uint8).reshape(3, 3),
        "nhwc": rng.standard_normal((1, 4, 3, 2)).astype(np.float32).transpose(0, 3, 1, 2),  # not C-contiguous
        "scalar": np.float64(2.5),
        "i8": np.array([-128, 127], np.int8),
    }


@pytest.mark.parametrize("direct", ["1", "0"])
def test_round_trip_and_library_compatibility(tmp_path, monkeypatch, direct):
    monkeypatch.setenv("ANPRED_DIRECT_IO", direct)
    arrs = _arrays()
    p = tmp_path / "a.safetensors"
    n = write_safetensors(p, arrs)
    assert n == os.path.getsize(p) and n % 4096 != 0  # truncated to its exact length after the padded write
    for got in (read_safetensors(p), stn.load_file(str(p))):  # ours, and the safetensors package's reader
        assert set(got) == set(arrs)
        for k, v in arrs.items():
            assert got[k].dtype == v.dtype and got[k].shape == np.shape(v) and np.array_equal(got[k], v), k
    assert list(read_safetensors(p)) == list(arrs)  # the writer's key order comes back
    # a file written by the safetensors package is read too
    stn.save_file({"x": arrs["anchor/01/model.2"], "s": np.array(3, np.int32)}, str(tmp_path / "lib.safetensors"))
    got = read_safetensors(tmp_path / "lib.safetensors")
    assert np.array_equal(got["x"], arrs["anchor/01/model.2"]) and got["s"].shape == () and got["s"] == 3


def test_direct_and_buffered_files_are_identical(tmp_path, monkeypatch):
    arrs = _arrays()
    write_safetensors(tmp_path / "d.safetensors", arrs)
    monkeypatch.setenv("ANPRED_DIRECT_IO", "0")
    write_safetensors(tmp_path / "b.safetensors", arrs)
    assert (tmp_path / "d.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    # a larger sample after a smaller one: the staging buffer grows, earlier bytes do not leak in
    big = {"z": np.full(3 << 20, 1.5, np.float32)}
    write_safetensors(tmp_path / "big.safetensors", big)
    small = {"y": np.arange(3, dtype=np.float32)}
    write_safetensors(tmp_path / "small.safetensors", small)
    assert os.path.getsize(tmp_path / "small.safetensors") < 200
    assert read_safetensors(tmp_path / "small.safetensors")["y"].tolist() == [0.0, 1.0, 2.0]


def test_corrupt_file_is_a_value_error(tmp_path):
    p = tmp_path / "a.safetensors"
    write_safetensors(p, _arrays())
    p.write_bytes(p.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        read_safetensors(p)


def test_store_falls_back_to_npz_for_dtypes_safetensors_lacks(tmp_path):
    """bfloat16 is stored as safetensors BF16 and comes back as ml_dtypes.bfloat16 (regression, review:
    the .npz fallback returned it as void 'V2'); float8 and big-endian arrays go to .npz."""
    man = AnchorManifest(anchors=[])
    st = RunStore.create(tmp_path / "run", man)
    bf = (np.arange(4, dtype=np.float32) + 0.5).astype(ml_dtypes.bfloat16)
    f8 = np.array([0.5, 1.0], np.float32).astype(ml_dtypes.float8_e4m3fn)
    be = np.arange(3, dtype=">f4")
    for sid, arrs in (
        ("s0", {"a/b": np.ones(2, np.float32)}),
        ("s1", {"a/b": bf}),
        ("s2", {"a/b": be}),
        ("s3", {"a/b": f8}),
    ):
        st.write_anchors("ort", sid, arrs)
    files = sorted(p.name for p in st.backend_dir("ort").iterdir())
    assert files == ["s0.safetensors", "s1.safetensors", "s2.npz", "s3.npz"]
    assert storable({"x": bf}) and not storable({"x": f8}) and not storable({"x": be})
    assert st.anchor_file("ort", "s2").suffix == ".npz" and st.anchor_file("ort", "s9") is None
    assert st.read_anchors("ort", "s0")["a/b"].tolist() == [1.0, 1.0]
    got = st.read_anchors("ort", "s1")["a/b"]
    assert got.dtype == ml_dtypes.bfloat16 and got.astype(np.float32).tolist() == [0.5, 1.5, 2.5, 3.5]
    assert st.read_anchors("ort", "s2")["a/b"].tolist() == [0.0, 1.0, 2.0]
    assert st.read_anchors("ort", "s3")["a/b"].view(np.uint8).tolist() == f8.view(np.uint8).tolist()
    assert st.read_anchors("ort", "s9") == {}


@pytest.mark.parametrize("where", ["open", "write"])
def test_direct_io_refused_falls_back_to_buffered(tmp_path, monkeypatch, where):
    """A file system that refuses O_DIRECT (EINVAL at open, as tmpfs did before Linux 6.6, or at the
    first write) gets the same bytes written buffered, and is remembered as refusing."""
    import errno

    import anpred.tensorfile as tfm

    monkeypatch.setattr(tfm, "_direct_refused", set())
    real_open, real_write = os.open, os.write
    direct_fds = set()

    def fake_open(path, flags, *a):
        if flags & os.O_DIRECT:
            if where == "open":
                raise OSError(errno.EINVAL, "Invalid argument")
            fd = real_open(path, flags & ~os.O_DIRECT, *a)
            direct_fds.add(fd)
            return fd
        return real_open(path, flags, *a)

    def fake_write(fd, data):
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(tfm.os, "open", fake_open)
    monkeypatch.setattr(tfm.os, "write", fake_write)
    arrs = _arrays()
    n = write_safetensors(tmp_path / "a.safetensors", arrs)
    assert tfm._direct_refused == {os.stat(tmp_path).st_dev}
    assert os.path.getsize(tmp_path / "a.safetensors") == n
    monkeypatch.setattr(tfm.os, "open", real_open)
    monkeypatch.setattr(tfm.os, "write", real_write)
    monkeypatch.setenv("ANPRED_DIRECT_IO", "0")
    write_safetensors(tmp_path / "b.safetensors", arrs)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


@pytest.mark.isa_independent(SAME_DATA)
@pytest.mark.parametrize("chunk", [3, 1 << 16])
def test_chunked_summary_equals_the_two_pass_reference(monkeypatch, chunk):
    """The one-pass chunked summary (Chan et al. merge per chunk) against numpy's two-pass values, with
    NaN/Inf in some chunks only and a mean far from zero (cancellation)."""
    monkeypatch.setattr(StreamingStats, "CHUNK", chunk)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(1001) * 1e-2 + 1e3).astype(np.float32)
    x[[4, 500]] = np.nan
    x[7], x[999] = np.inf, -np.inf
    s = StreamingStats.summarize(x)
    f = x[np.isfinite(x)].astype(np.float64)
    assert (s["elements"], s["count"], s["nan"], s["posinf"], s["neginf"]) == (1001, 997, 2, 1, 1)
    assert s["mean"] == pytest.approx(f.mean(), rel=1e-14)
    assert s["m2"] == pytest.approx(((f - f.mean()) ** 2).sum(), rel=1e-9)
    assert s["sum_sq"] == pytest.approx((f * f).sum(), rel=1e-12)
    assert s["sum_abs"] == pytest.approx(np.abs(f).sum(), rel=1e-12)
    assert (s["min"], s["max"]) == (f.min(), f.max())
    # ints, bools, 0-d and empty arrays
    assert StreamingStats.summarize(np.arange(10))["m2"] == 82.5
    assert StreamingStats.summarize(np.array([True, False, True]))["mean"] == pytest.approx(2 / 3)
    assert StreamingStats.summarize(np.float32(4.0))["sum_sq"] == 16.0
    e = StreamingStats.summarize(np.zeros((0, 3), np.float32))
    assert (e["count"], e["elements"], e["min"]) == (0, 0, math.inf)


def test_worker_malloc_tunables_keep_the_users_settings():
    assert worker_malloc_tunables("") == "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824"
    mine = "glibc.malloc.trim_threshold=0:glibc.cpu.hwcaps=-AVX512F"
    out = worker_malloc_tunables(mine)
    assert out.startswith(mine + ":") and out.count("trim_threshold") == 1
    assert out.endswith("glibc.malloc.mmap_threshold=268435456")


@pytest.mark.isa_independent(SAME_DATA)
def test_run_stores_safetensors_and_the_worker_gets_the_tunables(tmp_path):
    """A real ort run: tensors land as .safetensors that the safetensors package reads back, equal to
    a plain InferenceSession.run; the worker's environment carried the malloc tunables."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper as h

    from anpred.instrument import instrument_file
    from anpred.run import run_model

    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node("Sigmoid", ["r"], ["y"], name="sig")],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 8])],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.save(m, tmp_path / "m.onnx")
    instrument_file(tmp_path / "m.onnx", tmp_path / "a.onnx")
    store = run_model(tmp_path / "a.onnx", ["ort"], "random:normal:seed=2:n=2", tmp_path / "run", progress=False)
    sess = ort.InferenceSession(str(tmp_path / "a.onnx"), providers=["CPUExecutionProvider"])
    by_value = {a.value: a.name for a in store.manifest.anchors}
    names = [by_value[o.name] for o in sess.get_outputs()]
    for sid in store.sample_ids:
        p = store.anchor_file("ort", sid)
        assert p.suffix == ".safetensors"
        lib = stn.load_file(str(p))
        want = dict(zip(names, sess.run(None, store.read_inputs(sid))))
        assert set(lib) == set(want) == set(store.manifest.names())
        assert all(np.array_equal(lib[k], want[k]) for k in want)
    want_tunables = worker_malloc_tunables(os.environ.get("GLIBC_TUNABLES", ""))
    assert store.meta["resources"]["ort"]["glibc_tunables"] == want_tunables
    assert json.loads((store.root / "run.json").read_text())["backends"]["ort"]["status"] == "ok"


def test_staging_buffer_is_kept_only_up_to_its_cap(tmp_path, monkeypatch):
    import anpred.tensorfile as tfm

    monkeypatch.setattr(tfm, "_CACHE_MAX", 2 << 20)
    monkeypatch.setattr(tfm, "_local", __import__("threading").local())
    write_safetensors(tmp_path / "a.safetensors", {"x": np.ones(1000, np.float32)})
    kept = tfm._local.buf
    assert kept.size == 1 << 20
    big = {"y": np.arange(1 << 20, dtype=np.float32)}  # 4 MiB > the cap: a one-off buffer
    write_safetensors(tmp_path / "b.safetensors", big)
    assert tfm._local.buf is kept
    assert np.array_equal(read_safetensors(tmp_path / "b.safetensors")["y"], big["y"])
