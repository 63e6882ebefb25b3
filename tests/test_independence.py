"""Error correlation of voting families by the three-cornered hat (issue 18, deliverable 4): values
known by construction (independent errors of set sizes, one pair sharing part of its error)."""

from __future__ import annotations

import itertools

import numpy as np

from anpred.judge.independence import PairDistances, error_correlation, merge_correlated


def _families(rho_ab: float, n: int = 200_000, seed: int = 0):
    """Six families around a truth: independent errors of standard deviations 1..6 (x 1e-6), except
    a and b whose errors share a component so that corr(e_a, e_b) = rho_ab (both of std 1e-6)."""
    rng = np.random.default_rng(seed)
    t = rng.normal(size=n)
    shared, own_a, own_b = (rng.normal(size=n) for _ in range(3))
    a = np.sqrt(rho_ab) * shared + np.sqrt(1 - rho_ab) * own_a
    b = np.sqrt(rho_ab) * shared + np.sqrt(1 - rho_ab) * own_b
    votes = {"a": t + 1e-6 * a, "b": t + 1e-6 * b}
    for k, f in enumerate("cdef", start=3):
        votes[f] = t + k * 1e-6 * rng.normal(size=n)
    return votes


def test_three_cornered_hat_recovers_the_shared_part():
    for rho in (0.0, 0.5, 0.9):
        pd = PairDistances()
        pd.add("x", _families(rho))
        r = pd.rho("x", list("abcdef"))
        assert abs(r[frozenset("ab")] - rho) < 0.05, (rho, r[frozenset("ab")])
        others = [v for p, v in r.items() if p != frozenset("ab")]
        assert max(abs(v) for v in others) < 0.15  # independent pairs: near 0 (sampling noise of the hat: 0.10 seen)


def test_fewer_than_four_families_give_no_estimate():
    votes = _families(0.9)
    d2 = {frozenset(p): float(np.sum((votes[p[0]] - votes[p[1]]) ** 2)) for p in itertools.combinations("abc", 2)}
    assert error_correlation(d2, list("abc")) == {}


def test_merge_stops_at_the_threshold_and_keeps_min_groups():
    votes = _families(0.9)
    d2 = {frozenset(p): float(np.sum((votes[p[0]] - votes[p[1]]) ** 2)) for p in itertools.combinations("abcdef", 2)}
    groups, merged = merge_correlated(d2, [[f] for f in "abcdef"], 0.8, 3)
    assert sorted(map(sorted, groups)) == [["a", "b"], ["c"], ["d"], ["e"], ["f"]]
    assert list(merged) == [frozenset("ab")] and 0.85 < merged[frozenset("ab")] < 0.95
    assert merge_correlated(d2, [[f] for f in "abcdef"], 0.95, 3)[1] == {}  # below the threshold: kept apart
    assert len(merge_correlated(d2, [[f] for f in "abcdef"], 0.8, 6)[0]) == 6  # min_groups respected


def test_guard_keeps_precise_independent_families_apart_when_one_family_is_far_off():
    """Five precise independent families (error 1e-6) and one far off (1e-2, a real defect): the hat's
    variance estimates of the precise ones are differences of numbers 1e8 times larger, and it reports
    rho 1.0 for several precise pairs (seed 0: a~b, b~c, b~d); the nearest-corner guard refuses every
    merge (each precise family is as close to the other precise ones as to its 'partner')."""
    rng = np.random.default_rng(0)
    n = 20_000
    t = rng.normal(size=n)
    votes = {f: t + 1e-6 * rng.normal(size=n) for f in "abcde"}
    votes["z"] = t + 1e-2 * rng.normal(size=n)
    pd = PairDistances()
    pd.add("x", votes)
    fooled = {p for p, r in error_correlation(pd.d2["x"], sorted(votes)).items() if r >= 0.8 and "z" not in p}
    assert fooled == {frozenset("ab"), frozenset("bc"), frozenset("bd")}
    groups, merged = merge_correlated(pd.d2["x"], [[f] for f in sorted(votes)], 0.8, 3)
    assert merged == {} and len(groups) == 6
