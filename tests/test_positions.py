"""Sampled positions of large anchors (issue 20): canonical positions mapped through alignment rules onto
the indices of a backend's own tensor, exactly, for every kind of data movement the rules know."""

from __future__ import annotations

import numpy as np
import pytest

from anpred.align.rules import apply_rule
from anpred.judge.positions import PositionSampler, sample_positions
from anpred.run.positions import GATHERED_SUFFIX, backend_indices, gather, load_gather, save_gather
from isa_reasons import SAME_DATA


@pytest.mark.parametrize(
    "rule, backend_shape",
    [
        ({}, [1, 6, 5, 4]),
        ({"permute": [0, 3, 1, 2]}, [1, 5, 4, 6]),  # NHWC -> NCHW
        ({"reshape": True}, [6, 20]),  # flattened, batch squeezed
        ({"view": [1, 5, 4, 6], "permute": [0, 3, 1, 2]}, [120]),  # a flat NHWC buffer
        ({"segments": {"axis": 1, "order": [[4, 2], [0, 4]]}}, [1, 6, 5, 4]),  # heads concatenated in another order
        ({"dequantize": {"scale": 0.5, "zero_point": 3}, "permute": [0, 3, 1, 2]}, [1, 5, 4, 6]),
    ],
)
@pytest.mark.isa_independent(SAME_DATA)
def test_backend_indices_pick_the_canonical_positions(rule, backend_shape):
    """x (the backend's tensor) gathered at the mapped indices == apply_rule(rule, x) at the positions."""
    canonical = [1, 6, 5, 4]
    x = np.random.default_rng(0).integers(0, 200, size=backend_shape).astype(np.float32)
    want_full = apply_rule(rule, x, tuple(canonical)).reshape(-1)
    pos = sample_positions("anchor/00/conv", 120, 17)
    idx = backend_indices(rule, backend_shape, canonical, pos)
    values = {k: rule[k] for k in ("cast", "dequantize") if k in rule}
    got = apply_rule(values, x.reshape(-1)[idx], None)
    np.testing.assert_array_equal(got, want_full[pos])


def test_rules_that_depend_on_the_position_are_not_gathered():
    per_axis = {"dequantize": {"scale": [0.5, 0.25], "zero_point": [0, 1], "axis": 1}}
    assert backend_indices(per_axis, [1, 2, 3], [1, 2, 3], np.arange(3)) is None
    assert backend_indices({"exclude": "why"}, [1, 2, 3], [1, 2, 3], np.arange(3)) is None
    with pytest.raises(ValueError):  # a rule that does not fit the shape it was decided on
        backend_indices({"permute": [0, 2, 1]}, [1, 2], [1, 2], np.arange(2))


def test_positions_are_reproducible_and_small_anchors_stay_whole():
    a, b = sample_positions("anchor/03/x", 10_000, 500), sample_positions("anchor/03/x", 10_000, 500)
    np.testing.assert_array_equal(a, b)
    assert a.size == 500 == np.unique(a).size and a.min() >= 0 and a.max() < 10_000 and (np.diff(a) > 0).all()
    assert not np.array_equal(a, sample_positions("anchor/03/y", 10_000, 500))
    assert sample_positions("anchor/03/x", 500, 500) is None and sample_positions("anchor/03/x", 10, 0) is None


@pytest.mark.isa_independent(SAME_DATA)
def test_gather_file_round_trip_and_worker_gather(tmp_path):
    """The worker stores an anchor of the recorded shape as its values at the indices; another shape
    (a dynamic dim) and the anchors not listed stay whole."""
    idx = np.array([5, 0, 7], np.int64)
    path = save_gather(tmp_path / "g" / "0.npz", {"anchor/01/a": ([2, 4], idx)})
    spec = load_gather(path)
    assert list(spec) == ["anchor/01/a"] and spec["anchor/01/a"][0] == (2, 4)
    x = np.arange(8, dtype=np.float16).reshape(2, 4)
    out = gather({"anchor/01/a": x, "output/y": x}, spec)
    assert set(out) == {"anchor/01/a" + GATHERED_SUFFIX, "output/y"}
    np.testing.assert_array_equal(out["anchor/01/a" + GATHERED_SUFFIX], np.array([5, 0, 7], np.float16))
    assert out["anchor/01/a" + GATHERED_SUFFIX].dtype == np.float16
    other = np.zeros((3, 4), np.float32)
    assert gather({"anchor/01/a": other}, spec)["anchor/01/a"] is other


def test_sampler_leaves_outputs_and_other_shapes_alone():
    class A:
        def __init__(self, name, kind):
            self.name, self.kind = name, kind

    class M:
        anchors = [A("anchor/00/a", "boundary"), A("output/y", "output")]

    s = PositionSampler(M(), 10)
    big, odd = np.arange(40.0).reshape(2, 20), np.arange(30.0)
    t = {"anchor/00/a": {"ort": big, "tf": big + 1, "bad": odd}, "output/y": {"ort": big}}
    s.apply(t)
    pos = s.positions("anchor/00/a", 40)
    np.testing.assert_array_equal(t["anchor/00/a"]["ort"], big.reshape(-1)[pos])
    np.testing.assert_array_equal(t["anchor/00/a"]["tf"], big.reshape(-1)[pos] + 1)
    assert t["anchor/00/a"]["bad"] is odd and t["output/y"]["ort"] is big  # the oracle still sees a shape mismatch


def test_sampler_pickles_small_and_draws_the_same_positions_again():
    """A streamed run's checkpoint holds the sampler: its positions are drawn again from their seeds."""
    import pickle

    class A:
        def __init__(self, name):
            self.name, self.kind = name, "boundary"

    class M:
        anchors = [A("anchor/00/a"), A("anchor/01/b")]

    s = PositionSampler(M(), 1000)
    want = s.positions("anchor/00/a", 2_000_000).copy()
    assert s.positions("anchor/01/b", 10) is None
    blob = pickle.dumps(s)
    assert len(blob) < 1000  # not the 8 KB of positions
    t = pickle.loads(blob)
    np.testing.assert_array_equal(t.positions("anchor/00/a", 2_000_000), want)
    assert t.sampled_sizes() == {"anchor/00/a": 2_000_000}
