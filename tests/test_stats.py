"""anpred.judge.stats: error statistics against hand-computed values and library references."""

import math

import numpy as np
import pytest

from anpred.judge import ErrorStats, error_stats, ulp


def test_statistics_match_hand_computed_values():
    c = np.array([1.0, -2.0, 3.0, 4.0])
    x = np.array([1.5, -2.0, 2.0, 4.0], dtype=np.float32)
    s = error_stats(x, c)
    d = x.astype(np.float64) - c
    assert s.n == 4 and s.nan == 0 and s.inf == 0
    assert s.max_abs == 1.0
    assert s.mean_abs == pytest.approx(0.375)
    assert s.mean_signed == pytest.approx(-0.125)
    assert s.nrmse == pytest.approx(np.linalg.norm(d) / np.linalg.norm(c))
    assert s.snr_db == pytest.approx(-20 * math.log10(s.nrmse))
    assert s.cosine == pytest.approx(float(x @ c) / (np.linalg.norm(x) * np.linalg.norm(c)))
    # W1 of the two 4-point distributions = mean |sorted(x) - sorted(c)|, divided by std(c)
    w1 = np.mean(np.abs(np.sort(x) - np.sort(c)))
    assert s.wasserstein == pytest.approx(w1 / np.std(c))
    # max ULP: |d|/spacing_f32(c) at each position; 1.0 at c=3 (spacing 2.38e-7) dominates
    assert s.max_ulp == pytest.approx(1.0 / float(np.spacing(np.float32(3.0))))


def test_identical_tensors_are_perfect():
    c = np.linspace(-3, 3, 101)
    s = error_stats(c.astype(np.float32), c.astype(np.float32))
    assert (s.max_abs, s.nrmse, s.wasserstein, s.max_ulp) == (0.0, 0.0, 0.0, 0.0)
    assert s.snr_db == math.inf and s.cosine == 1.0


def test_one_ulp_perturbation_counts_one_ulp_per_dtype():
    c = np.array([1.0, 1.5, 3.0], dtype=np.float32)
    x = np.nextafter(c, np.float32(10))
    assert error_stats(x, c, "float32").max_ulp == pytest.approx(1.0)
    assert error_stats(x, c, "float16").max_ulp == pytest.approx(
        float(np.spacing(np.float32(3.0))) / float(np.spacing(np.float16(3.0)))
    )
    assert ulp(np.array([1.0]), "bf16")[0] == 2.0**-7
    assert ulp(np.array([1.0]), "fp16")[0] == 2.0**-10


def test_nan_and_inf_are_counted_not_propagated():
    c = np.ones(6)
    x = np.array([1.0, np.nan, np.inf, -np.inf, 1.1, 1.0])
    s = error_stats(x, c)
    assert (s.nan, s.inf, s.n) == (1, 2, 3)
    assert math.isfinite(s.nrmse) and s.max_abs == pytest.approx(0.1)
    allnan = error_stats(np.full(4, np.nan), np.ones(4))
    assert allnan.n == 0 and allnan.nan == 4 and math.isnan(allnan.nrmse)
    ref_nan = error_stats(np.ones(3), np.array([1.0, np.nan, 1.0]))
    assert ref_nan.nan_ref == 1 and ref_nan.n == 2 and ref_nan.nrmse == 0.0


def test_zero_reference_and_json_roundtrip():
    s = error_stats(np.array([0.0, 1e-3]), np.zeros(2))
    assert s.nrmse == math.inf and s.cosine == 0.0
    d = s.to_dict()
    assert d["nrmse"] == "inf"
    assert ErrorStats.from_dict(d) == s
    with pytest.raises(ValueError, match="do not match"):
        error_stats(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="unknown dtype"):
        error_stats(np.ones(3), np.ones(3), "float8")


def test_distribution_shift_is_seen_by_wasserstein_not_by_position():
    rng = np.random.default_rng(0)
    c = rng.standard_normal(10000)
    perm = rng.permutation(c)  # same distribution, values moved: large nRMSE, W1 = 0
    s = error_stats(perm, c)
    assert s.wasserstein == pytest.approx(0.0, abs=1e-12) and s.nrmse > 1.0
    shifted = error_stats(c + 0.1, c)
    assert shifted.wasserstein == pytest.approx(0.1 / np.std(c), rel=1e-9)
    assert shifted.mean_signed == pytest.approx(0.1)


def test_w1_formula_equals_scipy():
    """The sorted-difference (quantile) form of W1 used for equal-size samples equals
    scipy.stats.wasserstein_distance (which the docs cite) on skewed, tied and shifted data."""
    from scipy.stats import wasserstein_distance

    rng = np.random.default_rng(4)
    for c, x in [
        (rng.standard_normal(5000), rng.standard_normal(5000) * 1.3 + 0.2),
        (rng.exponential(size=777), np.round(rng.exponential(size=777), 1)),
        (np.arange(10.0), np.arange(10.0)[::-1] + 1e-3),
    ]:
        s = error_stats(x, c)
        assert s.wasserstein * np.std(c) == pytest.approx(wasserstein_distance(x, c), rel=1e-12, abs=1e-15)


def test_reference_shared_by_backends_matches_error_stats():
    """anpred.judge.Reference (consensus prepared once) gives exactly error_stats' values, also with
    NaN/Inf in the tensor or in the consensus."""
    from anpred.judge import Reference

    rng = np.random.default_rng(5)
    c = rng.standard_normal((2, 3, 50))
    ref = Reference(c)
    for x in (c + 1e-3 * rng.standard_normal(c.shape), np.where(rng.random(c.shape) < 0.05, np.nan, c * 1.01)):
        cmp = ref.compare(x.astype(np.float32), "float16")
        assert cmp.stats == error_stats(x.astype(np.float32), c, "float16")
    c2 = c.copy()
    c2[0, 0, :3] = [np.nan, np.inf, -np.inf]
    x = c2 + 1e-4
    x[1, 1, 1] = np.nan
    cmp = Reference(c2).compare(x)
    assert cmp.stats == error_stats(x, c2) and cmp.stats.n == c.size - 4
    assert (cmp.stats.nan, cmp.stats.inf, cmp.stats.nan_ref, cmp.stats.inf_ref, cmp.nonfinite) == (2, 2, 1, 2, 1)


def test_int8_backends_count_float32_ulps():
    """Quantized backends hand back dequantized float32 anchors: max_ulp is in float32 ULPs."""
    from anpred.judge import ulp_dtype

    assert [ulp_dtype(p) for p in ("fp32", "fp16", "bf16", "int8")] == ["float32", "float16", "bfloat16", "float32"]


def test_wasserstein_on_distribution_positions():
    """A streamed run computes the Wasserstein distance of a tensor judged in full on its K sampled
    positions (anpred.judge.positions): W1 equals scipy's on that subsample (normalized by the whole
    consensus' std), and every other statistic stays the whole tensor's."""
    from scipy.stats import wasserstein_distance

    from anpred.judge.positions import sample_positions
    from anpred.judge.stats import Reference

    rng = np.random.default_rng(0)
    c = rng.standard_normal(300_000)
    x = (c + 1e-3 * rng.standard_normal(c.size)).astype(np.float32)
    pos = sample_positions("output/y", c.size, 4096)
    sub = Reference(c, distribution_positions=pos).compare(x).stats
    full = Reference(c).compare(x).stats
    want = wasserstein_distance(x[pos].astype(np.float64), c[pos]) / np.std(c)
    assert sub.wasserstein == pytest.approx(want, rel=1e-9)
    assert sub.wasserstein != full.wasserstein
    for k in ("nrmse", "max_abs", "mean_abs", "cosine", "snr_db", "max_ulp"):
        assert getattr(sub, k) == getattr(full, k)


def test_distribution_positions_ignored_with_agreed_nonfinite_values():
    """Masked logits: the consensus and the backend agree on -inf at 2,000 places. The finite values
    are then fewer than the tensor, so flat sampled positions would index past them (IndexError, or the
    wrong values): the Wasserstein distance is then computed on every finite value."""
    from anpred.judge.positions import sample_positions
    from anpred.judge.stats import Reference

    rng = np.random.default_rng(1)
    c = rng.standard_normal(50_000)
    c[:2000] = -np.inf
    x = c.copy()
    x[2000:] += 1e-4 * rng.standard_normal(48_000)
    st = Reference(c, distribution_positions=sample_positions("output/logits", c.size, 4096)).compare(x).stats
    assert st.wasserstein == Reference(c).compare(x).stats.wasserstein and np.isfinite(st.wasserstein)


def test_wasserstein_in_the_consensus_order_equals_scipy():
    """One Reference shared by several backends sorts the consensus once (an argsort) and each backend's
    values in the consensus' order (a merge sort, linear on a close backend's nearly sorted runs, else
    the quicksort): every W1 equals scipy's, for a close backend (merge path), a far one (quicksort
    path), a permutation (W1 = 0), on distribution positions, and with NaN in the consensus or the
    backend."""
    from scipy.stats import wasserstein_distance

    from anpred.judge.positions import sample_positions
    from anpred.judge.stats import NEAR_SORTED_FRACTION, Reference, _sorted_near

    rng = np.random.default_rng(7)
    c = rng.standard_normal(40_000)
    close = (c * (1 + 1e-6 * rng.standard_normal(c.size))).astype(np.float32)
    far = (c + 0.5 * rng.standard_normal(c.size)).astype(np.float32)
    perm = rng.permutation(c)
    order = np.argsort(c)
    n = c.size
    # the two paths of _sorted_near are both taken here
    assert np.count_nonzero(close[order][64:] < close[order][:-64]) < NEAR_SORTED_FRACTION * n
    assert np.count_nonzero(far[order][64:] < far[order][:-64]) > NEAR_SORTED_FRACTION * n
    for y in (close[order].astype(np.float64), far[order].astype(np.float64), perm):
        assert np.array_equal(_sorted_near(y), np.sort(y))
    ref = Reference(c)
    for x in (close, far, perm):
        want = wasserstein_distance(np.asarray(x, np.float64), c) / np.std(c)
        assert ref.compare(x).stats.wasserstein == pytest.approx(want, rel=1e-12, abs=1e-18)
    assert ref.compare(perm).stats.wasserstein == 0.0
    pos = sample_positions("conv/out", n, 4096)
    sub = Reference(c, distribution_positions=pos)
    for x in (close, far):
        want = wasserstein_distance(np.asarray(x, np.float64)[pos], c[pos]) / np.std(c)
        assert sub.compare(x).stats.wasserstein == pytest.approx(want, rel=1e-12)
    cn = c.copy()
    cn[:100] = np.nan  # consensus NaN: the finite values are compared (the shared path over them)
    fin = np.isfinite(cn)
    w = Reference(cn).compare(close).stats.wasserstein
    assert w == pytest.approx(wasserstein_distance(close[fin].astype(np.float64), cn[fin]) / np.std(cn[fin]), rel=1e-12)
    xn = close.astype(np.float64)
    xn[-50:] = np.nan  # backend NaN: compared where both are finite (not the shared order)
    ok = np.isfinite(xn)
    assert ref.compare(xn).stats.wasserstein == pytest.approx(
        wasserstein_distance(xn[ok], c[ok]) / np.std(c[ok]), rel=1e-12
    )


def test_same_array_is_array_equal():
    """The judge's bit-identity question (anpred.judge.stats.same_array) answers as np.array_equal:
    a difference at one element off the ~256 it looks at first, NaN (equal to nothing), other
    shapes, and strided (transposed) views."""
    from anpred.judge.stats import same_array

    rng = np.random.default_rng(3)
    a = rng.standard_normal(65536)
    cases = [(a, a.copy())]
    for i in (0, 5, 65535):  # 5: between the elements sampled first
        b = a.copy()
        b[i] = np.nextafter(b[i], np.inf)
        cases.append((a, b))
    n = a.copy()
    n[7] = np.nan
    cases += [
        (n, n.copy()),
        (a, a[:-1]),
        (a.reshape(256, 256), a.reshape(256, 256).T),
        (a.reshape(256, 256).T, a.reshape(256, 256).T.copy()),
        (np.zeros(0), np.zeros(0)),
    ]
    got = [same_array(x, y) for x, y in cases]
    assert got == [bool(np.array_equal(x, y)) for x, y in cases]
    assert got == [True, False, False, False, False, False, False, True, True]
