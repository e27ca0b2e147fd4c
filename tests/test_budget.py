"""A sweep's CPU-second budget (sweeps/running/stoppers.py: Spend, BudgetStopper) ends it within one epoch of
the budget, with trials running side by side; driven with the results Tune would hand over."""

from __future__ import annotations

import heapq

import pytest

from sweeps.running.stoppers import BudgetStopper, Spend
from sweeps.running.tune_result import TrialResult, to_tune
from tests.conftest import epoch_record


def spend_until_stopped(
    budget: float, epoch_costs: dict[int, float], workers: int = 2, epochs: int = 50, before: Spend | None = None
) -> float:
    """Trials of the given epoch costs (trial number: seconds) start one per free worker while
    the budget can pay a new trial's first epoch; each epoch's result goes to the stopper, as Tune
    hands it over. ``before``: what earlier sessions spent. What the sweep spent in all."""
    spend = before or Spend(1.0)
    stopper = BudgetStopper(spend, budget)
    waiting = sorted(epoch_costs)
    events: list[tuple[float, int, int]] = []  # (ends at, trial, epoch)

    def start(now: float) -> None:
        if waiting and not spend.exhausted(budget, starting=True):
            number = waiting.pop(0)
            spend.started(number)
            heapq.heappush(events, (now + epoch_costs[number], number, 1))

    for _ in range(workers):
        start(0.0)
    while events:
        now, number, epoch = heapq.heappop(events)
        result = TrialResult(number, epoch_record(epoch=epoch, epoch_seconds=epoch_costs[number]), False, {}, {})
        if stopper(str(number), to_tune(result)) or epoch == epochs:
            spend.ended(number)
            start(now)
        else:
            heapq.heappush(events, (now + epoch_costs[number], number, epoch + 1))
    return spend.total


@pytest.mark.parametrize("budget", [10.3, 25.0, 40.9])
@pytest.mark.parametrize(
    "costs", [{0: 1.0, 1: 1.0, 2: 1.0}, {0: 0.7, 1: 1.9, 2: 1.3, 3: 0.4}], ids=["equal epochs", "unequal epochs"]
)
def test_a_budget_is_kept_to_within_one_epoch_with_two_trials_running(budget, costs):
    spent = spend_until_stopped(budget, costs)
    longest = max(costs.values())
    assert budget - longest <= spent <= budget + longest, spent


def test_the_first_epoch_is_always_paid_and_a_spent_budget_starts_nothing():
    """A budget smaller than one epoch still trains the first epoch of each worker's trial (its
    cost is not known before it ends), and no trial after."""
    assert spend_until_stopped(0.5, {0: 2.0, 1: 2.0, 2: 2.0}) == 4.0


def test_a_resumed_sweep_prices_a_new_trial_at_this_sessions_epochs_not_at_all_it_spent():
    """Resumed with 10 s spent before, one epoch of 1 s since: a new trial's first epoch is priced
    at 1 s, so a budget of 20 s can pay it (11 spent + 1 for the running trial + 1)."""
    spend = Spend(1.0, spent=10.0)
    spend.add(0, epoch_record(epoch=1, epoch_seconds=1.0))
    assert not spend.exhausted(20.0, starting=True)
    assert spend.exhausted(12.5, starting=True) and not spend.exhausted(12.5)


def test_a_resumed_sweep_whose_budget_is_spent_starts_no_trial():
    """Stopped by its budget with 9.5 s of 10 spent over 5 epochs, then resumed (which lifts the
    drain): a new trial's first epoch is priced at the earlier sessions' 1.9 s, so none starts;
    priced at nothing (no epoch yet this session), every worker started one (an H200 bench run)."""
    assert Spend(1.0, spent=9.5, epochs=5).exhausted(10.0, starting=True)
    assert spend_until_stopped(10.0, {n: 1.9 for n in range(8)}, workers=8, before=Spend(1.0, 9.5, 5)) == 9.5


@pytest.mark.parametrize("workers", [2, 8])
def test_trials_that_start_together_are_each_priced_so_the_budget_holds_to_one_epoch(workers):
    """Resumed with 5 s of 10 spent over 5 epochs and every worker free at once: each trial started
    is priced at a typical epoch before it reports, so no more start than the budget can pay."""
    spent = spend_until_stopped(10.0, {n: 1.0 for n in range(8)}, workers=workers, before=Spend(1.0, 5.0, 5))
    assert 10.0 - 1.0 <= spent <= 10.0 + 1.0, spent
