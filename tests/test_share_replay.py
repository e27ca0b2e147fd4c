"""research/share_replay.py: the three slot policies' choices, the value policy's gain per
slot-hour, and a share replay on the real evidence table (the same when repeated, which its
resumable parts rely on)."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from research import evidence_table as E
from research import replay as R
from research import share_replay as S


@pytest.fixture(scope="module")
def tables() -> dict[float, dict[int, list[R.Curve]]]:
    return R.tables_at(set(E.FRACTIONS))


def test_value_is_the_expected_improvement_over_the_incumbent_per_slot_hour(tables):
    sweep = S.sweeps_for(tables, 0)[0]
    assert sweep.value() == math.inf  # no evidence yet: it comes first
    sweep.ended += [(0.5, 100.0), (0.7, 300.0)]
    sweep.incumbent = 0.72
    sigma = math.sqrt(((0.5 - 0.6) ** 2 + (0.7 - 0.6) ** 2) / 1)
    z = (0.6 - 0.72) / sigma
    assert sweep.value() == pytest.approx(sigma * (z * norm.cdf(z) + norm.pdf(z)) / (200 / 3600))


def test_each_policy_hands_the_slot_to_its_sweep(tables):
    a, b, c = S.sweeps_for(tables, 0)[:3]
    order = [b, a, c]  # submitted b first
    a.held, b.held, c.held = 1, 3, 1
    a.ended = b.ended = c.ended = [(0.5, 100.0), (0.7, 100.0)]
    a.incumbent, b.incumbent, c.incumbent = 0.9, 0.7, 0.7
    c.ended = [(0.5, 100.0), (0.7, 400.0)]  # as promising as b, at half its rate of slot-hours
    assert S.choose("first-come", [a, b, c], order) is b
    assert S.choose("fair", [a, b, c], order) is a  # fewest held; ties to the earliest submitted
    a.closed, c.closed = 500.0, 200.0
    assert S.choose("fair-least-used", [a, b, c], order) is c  # fewest held; ties to the least used
    assert S.choose("value", [a, b, c], order) is b
    c.ended = c.ended[:1]
    assert S.choose("value", [a, b, c], order) is c  # no evidence yet


def test_a_share_replay_repeats_itself(tables):
    first = S.share(tables, "fair", 3)
    assert first == S.share(tables, "fair", 3)
    assert len(first.times) == 6 and all(t > 0 for t in first.times)
    assert all(r >= 0 for r in first.regrets) and all(first.reached)  # fair share: every sweep gets there
