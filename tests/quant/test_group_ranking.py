"""quant/group_ranking.py: segments ranked by measuring groups of them kept in float, on a
scorer whose gains are known (no TFLite file: the ranking only sees a score per set of
float tensors)."""

from __future__ import annotations

import numpy as np
import pytest

from onnx2tf_alt.quant.group_ranking import ranked_gains


def _scorer(gains: dict[str, float], calls: list[frozenset], noise: float = 0.0,
            seed: int = 0):
    """The cosine of a file with `tensors` in float: 0.9 plus the gains of those tensors
    (the additive model the ranking assumes), plus optional measurement noise."""
    rng = np.random.default_rng(seed)

    def score(tensors: frozenset) -> float:
        calls.append(tensors)
        return 0.9 + sum(gains.get(t, 0.0) for t in tensors) + noise * rng.standard_normal()
    return score


@pytest.mark.parametrize("count", [1, 7, 64, 300])
def test_the_largest_gains_are_found_within_the_budget(count):
    rng = np.random.default_rng(count)
    names = [f"t{k}" for k in range(count)]
    gains = {n: float(g) for n, g in zip(names, rng.exponential(1e-4, count))}
    big = rng.choice(count, size=min(3, count), replace=False)
    for rank, k in enumerate(big):  # three segments that lose far more than the rest
        gains[names[k]] = 0.02 / (rank + 1)
    segments = [frozenset({n}) for n in names]
    calls: list[frozenset] = []
    found, units = ranked_gains(segments, frozenset(), 0.9, _scorer(gains, calls),
                                measurements=24)
    assert len(calls) <= 24 and units == []
    order = np.argsort(found)[::-1]
    assert list(order[:len(big)]) == list(big), (order[:5], big)
    for k in big:
        assert found[k] == pytest.approx(gains[names[k]], abs=2e-3)


def test_kept_tensors_are_in_every_measured_file():
    calls: list[frozenset] = []
    segments = [frozenset({f"t{k}"}) for k in range(10)]
    ranked_gains(segments, frozenset({"kept"}), 0.9, _scorer({"t3": 0.01}, calls))
    assert calls and all("kept" in c for c in calls)


def test_groups_that_gain_nothing_are_not_split():
    """No gain anywhere: one measurement (the whole), every segment at 0."""
    calls: list[frozenset] = []
    segments = [frozenset({f"t{k}"}) for k in range(50)]
    found, units = ranked_gains(segments, frozenset(), 0.9, _scorer({}, calls))
    assert len(calls) == 1 and found == [0.0] * 50 and units == []


def test_measurement_noise_still_finds_a_dominant_segment():
    names = [f"t{k}" for k in range(120)]
    gains = dict.fromkeys(names, 1e-5)
    gains["t77"] = 0.03
    calls: list[frozenset] = []
    found, _ = ranked_gains([frozenset({n}) for n in names], frozenset(), 0.9,
                            _scorer(gains, calls, noise=1e-3, seed=1))
    assert int(np.argmax(found)) == 77


def test_a_joint_gain_is_one_unit_not_split_into_members_that_gain_nothing():
    """Segments 10-25 gain 0.08 together and nothing alone or in part (one value
    re-quantized by each of them: only with all in float does it stay exact), beside
    segment 60's additive 0.01: the front end comes back as one unit, its members at 0, and
    segment 60 is still found."""
    names = [f"t{k}" for k in range(100)]
    joint = set(names[10:26])
    calls: list[frozenset] = []

    def score(tensors: frozenset) -> float:
        calls.append(tensors)
        return 0.9 + (0.08 if joint <= tensors else 0.0) + (0.01 if "t60" in tensors else 0.0)

    found, units = ranked_gains([frozenset({n}) for n in names], frozenset(), 0.9, score)
    assert len(calls) <= 24
    (unit,) = units
    assert unit.first <= 10 and unit.stop >= 26 and unit.gain == pytest.approx(0.08)
    assert unit.size <= 50  # split down to the smallest group that holds the whole front end
    assert all(found[k] == 0.0 for k in range(unit.first, unit.stop))
    assert int(np.argmax(found)) == 60
