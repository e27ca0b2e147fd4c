"""What a person sees while a sweep runs (``sweeps.running.progress``): the short form of a trial's
parameters, the clock, the line per trial result (value, best so far, elapsed and time left), the
line when a trial ends, and the table of every trial at the end, built from real Optuna trials.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from typing import Literal

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from sweeps.running.progress import Progress, best_line, clock, short, show, summary
from sweeps.spec.sections import Objective
from tests.conftest import REPO, epoch_record

ACCURACY = Objective(metric="val_token_accuracy", mode="max")
LOSS = Objective(metric="val_loss", mode="min")
LATENT = Objective(metric="latent_fraction", mode="min")
TIMES = re.compile(r"  (\d+):(\d\d) elapsed  ~(\d+):(\d\d) left$")


def seconds(minutes: str, secs: str) -> int:
    return int(minutes) * 60 + int(secs)


# -- short and clock ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params, expected",
    [
        pytest.param({"train.lr": 0.00186, "model.d_model": 128}, "lr=1.9e-03 d_model=128", id="docstring"),
        pytest.param({"train.lr": 0.01}, "lr=0.01", id="float-at-lower-bound-plain"),
        pytest.param({"train.lr": 0.009999}, "lr=1.0e-02", id="float-below-bound-scientific"),
        pytest.param({"train.dropout": 0.12345}, "dropout=0.123", id="float-three-figures"),
        pytest.param({"train.warmup": 999.4}, "warmup=999", id="float-below-1000-plain"),
        pytest.param({"train.steps": 1500.0}, "steps=1.5e+03", id="float-from-1000-scientific"),
        pytest.param({"train.weight_decay": 0.0}, "weight_decay=0", id="zero-float"),
        pytest.param({"train.lr": -0.5}, "lr=-0.5", id="negative-float"),
        pytest.param({"model.block": "paper", "model.tied": True}, "block=paper tied=True", id="str-and-bool"),
        pytest.param({"heads": 4}, "heads=4", id="no-dot-in-key"),
        pytest.param({}, "", id="empty"),
    ],
)
def test_short_keeps_the_last_key_part_and_few_figures(params, expected):
    assert short(params) == expected


@pytest.mark.parametrize(
    "secs, expected",
    [
        pytest.param(0, "0:00", id="zero"),
        pytest.param(59.4, "0:59", id="rounds-down"),
        pytest.param(59.6, "1:00", id="rounds-up-to-a-minute"),
        pytest.param(83, "1:23", id="minutes"),
        pytest.param(3599.6, "1:00:00", id="rounds-up-to-an-hour"),
        pytest.param(3723, "1:02:03", id="hours"),
        pytest.param(36000, "10:00:00", id="ten-hours"),
    ],
)
def test_clock(secs, expected):
    assert clock(secs) == expected


# -- Progress ----------------------------------------------------------------------------------
@pytest.fixture
def progress():
    show()  # the lines print as the command line prints them, whichever test ran before
    made: list[Progress] = []

    def make(
        objective: Objective = ACCURACY, work: int = 9, epochs: int = 3, best: tuple[float, int] | None = None
    ) -> Progress:
        made.append(Progress("demo", objective, work=work, epochs=epochs, best=best))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_a_result_line_names_trial_epoch_params_value_and_best(progress, capsys):
    p = progress()
    assert p.left() is None  # no rate before the first result

    line = p.result(1, {"train.lr": 0.00186, "model.d_model": 128}, epoch_record(val_token_accuracy=0.97121, epoch=1))

    assert line.startswith(
        "trial 1  epoch 1/3  lr=1.9e-03 d_model=128  val_token_accuracy 0.9712  best 0.9712 (trial 1)  "
    )
    assert TIMES.search(line), line
    assert capsys.readouterr().out == line + "\n"  # printed as it is returned
    assert p.best == (0.97121, 1) and p.done == 1


@pytest.mark.parametrize(
    "objective, values, bests",
    [
        pytest.param(
            ACCURACY,
            [0.90, 0.95, 0.93, 0.95],
            [(0.90, 0), (0.95, 1), (0.95, 1), (0.95, 1)],
            id="max-keeps-the-highest-first-reached",
        ),
        pytest.param(
            LOSS,
            [0.50, 0.30, 0.40, 0.30],
            [(0.50, 0), (0.30, 1), (0.30, 1), (0.30, 1)],
            id="min-keeps-the-lowest-first-reached",
        ),
    ],
)
def test_best_so_far_follows_the_objectives_direction(progress, objective, values, bests):
    p = progress(objective, work=20)
    for trial, (value, best) in enumerate(zip(values, bests)):
        line = p.result(trial, {}, epoch_record(**{objective.metric: value}, epoch=1))
        assert p.best == best
        assert f"{objective.metric} {value:.4f}  best {best[0]:.4f} (trial {best[1]})" in line


def test_a_resumed_session_starts_from_the_best_of_earlier_sessions(progress):
    p = progress(ACCURACY, best=(0.98, 4))
    line = p.result(7, {"train.lr": 0.05}, epoch_record(val_token_accuracy=0.96, epoch=2))
    assert "val_token_accuracy 0.9600  best 0.9800 (trial 4)" in line
    line = p.result(7, {"train.lr": 0.05}, epoch_record(val_token_accuracy=0.985, epoch=3))
    assert "best 0.9850 (trial 7)" in line and p.best == (0.985, 7)


def test_time_left_is_the_remaining_trial_epochs_at_the_rate_so_far(progress):
    p = progress(work=8)
    p.started = time.monotonic() - 120  # as if the session had run two minutes
    p.result(0, {}, epoch_record(val_token_accuracy=0.5, epoch=1))
    line = p.result(0, {}, epoch_record(val_token_accuracy=0.6, epoch=2))

    m = TIMES.search(line)
    assert m, line
    elapsed, left = seconds(*m.group(1, 2)), seconds(*m.group(3, 4))
    assert elapsed >= 120
    assert left == pytest.approx((8 - 2) / 2 * elapsed, abs=3)  # 6 trial-epochs left at 2 per elapsed


@pytest.mark.parametrize(
    "epochs_run, how, why, text, work",
    [
        pytest.param(
            1,
            "stopped by the scheduler",
            None,
            "trial 0  stopped by the scheduler after 1 epoch",
            7,
            id="pruned-drops-unrun-epochs",
        ),
        pytest.param(
            0,
            "failed",
            "CUDA out of memory",
            "trial 0  failed after 0 epochs: CUDA out of memory",
            6,
            id="failed-with-reason",
        ),
        pytest.param(3, "finished", None, "trial 0  finished after 3 epochs", 9, id="finished-drops-nothing"),
    ],
)
def test_an_ended_trial_says_how_and_shrinks_the_remaining_work(progress, capsys, epochs_run, how, why, text, work):
    p = progress(work=9, epochs=3)
    p.ended(0, epochs_run, how, why)
    assert capsys.readouterr().out == text + "\n"
    assert p.work == work and p.bar.total == work


def test_remaining_work_never_drops_below_what_is_done(progress):
    p = progress(work=3, epochs=3)
    for epoch in (1, 2):
        p.result(0, {}, epoch_record(val_token_accuracy=0.5, epoch=epoch))
    p.ended(1, 0, "failed", "boom")  # 3 epochs it will not run, but 2 are already done
    assert (p.work, p.done) == (2, 2)
    p.result(2, {}, epoch_record(val_token_accuracy=0.5, epoch=1))  # more results than planned
    assert p.done == 2 and p.left() == 0


# -- summary -----------------------------------------------------------------------------------
LR = FloatDistribution(1e-5, 1.0, log=True)
D_MODEL = CategoricalDistribution([32, 64, 128])
LATENT_LEN = IntDistribution(1, 16)


Direction = Literal["minimize", "maximize"]


def study_of(*trials: optuna.trial.FrozenTrial, directions: tuple[Direction, ...] = ("maximize",)) -> list:
    """The trials as a study numbers them (0, 1, ...), which is what the driver passes."""
    study = optuna.create_study(directions=list(directions))
    for trial in trials:
        study.add_trial(trial)
    return study.trials


def trial(
    state: TrialState,
    lr: float,
    d_model: int,
    value: float | None = None,
    epochs: int = 0,
    user_attrs: dict | None = None,
) -> optuna.trial.FrozenTrial:
    return create_trial(
        state=state,
        value=value,
        params={"train.lr": lr, "model.d_model": d_model},
        distributions={"train.lr": LR, "model.d_model": D_MODEL},
        intermediate_values={e: 0.1 * (e + 1) for e in range(epochs)},
        user_attrs=user_attrs,
    )


def test_summary_of_a_single_objective_sweep_is_best_first_in_every_state():
    trials = study_of(
        trial(TrialState.COMPLETE, 1e-3, 64, 0.91, epochs=3),  # 0
        trial(TrialState.PRUNED, 0.02, 32, 0.62, epochs=1),  # 1: pruned, with its last value
        trial(TrialState.FAIL, 0.5, 64, epochs=1),  # 2
        trial(TrialState.COMPLETE, 3e-4, 128, 0.95123, epochs=3),  # 3
        trial(TrialState.RUNNING, 1e-3, 64, epochs=1),  # 4
        trial(TrialState.PRUNED, 0.1, 32),  # 5: pruned before its first report
    )
    assert summary(trials, (ACCURACY,)) == "\n".join(
        [
            "trial  state     epochs  val_token_accuracy  params",
            "3      COMPLETE  3       0.9512              lr=3.0e-04 d_model=128",
            "0      COMPLETE  3       0.9100              lr=1.0e-03 d_model=64",
            "1      PRUNED    1       0.6200              lr=0.02 d_model=32",
            "2      FAIL      1       -                   lr=0.5 d_model=64",
            "4      RUNNING   1       -                   lr=1.0e-03 d_model=64",
            "5      PRUNED    -       -                   lr=0.1 d_model=32",
        ]
    )


def test_summary_counts_epochs_trained_not_results_where_trials_validate_between_epochs_ends():
    """Nine results at train.validate_every 0.25 are 2.25 epochs, and a trial stopped after its
    first validation of 5 steps' epochs (after step 2) trained 0.4: the table says what each trial's
    latest result says it trained; a trial recorded before that was kept counts its results."""
    trials = study_of(
        trial(TrialState.COMPLETE, 1e-3, 64, 0.91, epochs=9, user_attrs={"seqae.trained": 2.25}),
        trial(TrialState.COMPLETE, 1e-3, 64, 0.6, epochs=1, user_attrs={"seqae.trained": 0.4}),
        trial(TrialState.COMPLETE, 1e-3, 64, 0.5, epochs=3),
    )
    assert [line.split()[2] for line in summary(trials, (ACCURACY,)).splitlines()[1:]] == ["2.25", "0.40", "3"]


def test_summary_of_a_minimized_objective_puts_the_lowest_first():
    trials = study_of(
        trial(TrialState.COMPLETE, 1e-3, 64, 0.35, epochs=2),
        trial(TrialState.FAIL, 1e-3, 64),
        trial(TrialState.COMPLETE, 1e-2, 32, 0.21, epochs=2),
        directions=("minimize",),
    )
    table = summary(trials, (LOSS,)).splitlines()
    assert table[0] == "trial  state     epochs  val_loss  params"
    assert [(row.split()[0], row.split()[3]) for row in table[1:]] == [("2", "0.2100"), ("0", "0.3500"), ("1", "-")]


def test_summary_of_a_multi_objective_sweep_has_a_column_per_objective():
    def multi(state: TrialState, latent_len: int, values: list[float] | None = None) -> optuna.trial.FrozenTrial:
        return create_trial(
            state=state,
            values=values,
            params={"model.latent_len": latent_len},
            distributions={"model.latent_len": LATENT_LEN},
        )

    trials = study_of(
        multi(TrialState.COMPLETE, 4, [0.9, 0.25]),
        multi(TrialState.COMPLETE, 8, [0.95, 0.5]),
        multi(TrialState.FAIL, 16),
        multi(TrialState.RUNNING, 2),
        directions=("maximize", "minimize"),
    )
    assert summary(trials, (ACCURACY, LATENT)) == "\n".join(
        [
            "trial  state     epochs  val_token_accuracy  latent_fraction  params",
            "1      COMPLETE  -       0.9500              0.5000           latent_len=8",
            "0      COMPLETE  -       0.9000              0.2500           latent_len=4",
            "2      FAIL      -       -                   -                latent_len=16",
            "3      RUNNING   -       -                   -                latent_len=2",
        ]
    )


def test_summary_of_no_trials_is_the_header_alone():
    assert summary([], (ACCURACY, LATENT)) == "trial  state  epochs  val_token_accuracy  latent_fraction  params"


def test_summary_names_starting_points_and_shows_the_kept_checkpoints_test_score_and_best_line_both():
    paper = create_trial(
        state=TrialState.COMPLETE,
        value=0.9,
        params={"train.lr": 1e-3, "model.d_model": 64},
        distributions={"train.lr": LR, "model.d_model": D_MODEL},
        intermediate_values={0: 0.9},
        user_attrs={"seqae.start": "paper", "seqae.test": {"test_token_accuracy": 0.88}},
    )
    trials = study_of(paper, trial(TrialState.COMPLETE, 3e-4, 128, 0.95, epochs=1), trial(TrialState.FAIL, 0.5, 64))
    assert summary(trials, (ACCURACY,)) == "\n".join(
        [
            "trial      state     epochs  val_token_accuracy  test_token_accuracy  params",
            "1          COMPLETE  1       0.9500              -                    lr=3.0e-04 d_model=128",
            "0 (paper)  COMPLETE  1       0.9000              0.8800               lr=1.0e-03 d_model=64",
            "2          FAIL      -       -                   -                    lr=0.5 d_model=64",
        ]
    )
    assert best_line([trials[0]], (ACCURACY,)) == (
        "best: trial 0  val_token_accuracy 0.9000 (validation, selected on)  "
        "test_token_accuracy 0.8800 (test pages, never selected on)"
    )
    assert best_line([trials[1]], (ACCURACY,)).endswith(
        "no test split (data.test_fraction is 0): the validation value is biased by the selection"
    )
    assert best_line([], (ACCURACY,)) == "no trial completed"


# -- a stopped trial's worker ------------------------------------------------------------------
STOPPED_IN_A_CALLBACK = """
import sys, weakref
class Node: pass
def stop(_): raise SystemExit(1)  # as Ray's SIGTERM handler raises it, wherever the worker is
node = Node(); ref = weakref.ref(node, stop); del node  # the callback runs here
print("went on after the stop")
"""


def test_a_trial_worker_stopped_inside_a_callback_exits_without_a_traceback():
    """Ray stops a trial's worker with SIGTERM, whose handler raises SystemExit wherever the main
    thread is. Inside a weak reference's callback Python cannot raise it: it prints the traceback
    (through the driver, on the user's terminal: seen in the quickstart) and goes on. With the hook
    every trial's worker sets, the worker exits with the code and prints nothing."""
    plain = subprocess.run([sys.executable, "-c", STOPPED_IN_A_CALLBACK], capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and "went on" in plain.stdout and "Traceback" in plain.stderr, plain  # the noise
    hooked = "from sweeps.running.trial import exit_quietly_on_stop\nsys.unraisablehook = exit_quietly_on_stop\n"
    script = STOPPED_IN_A_CALLBACK.replace("class Node", hooked + "class Node", 1)
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert (ran.returncode, ran.stdout, ran.stderr) == (1, "", ""), ran


def test_validations_between_epochs_ends_print_fractional_epochs_and_count_what_they_trained(progress):
    """train.validate_every=0.25: a line at each validation, its epochs trained a fraction, and the
    sweep's done work grows by the share of an epoch since the trial's previous result."""
    p = progress(work=6, epochs=3)
    lines = [p.result(0, {}, epoch_record(val_token_accuracy=0.5, epoch=epoch)) for epoch in (0.25, 0.5, 0.75, 1, 1.25)]
    assert [line.split("  ")[1] for line in lines] == [
        "epoch 0.25/3",
        "epoch 0.50/3",
        "epoch 0.75/3",
        "epoch 1/3",
        "epoch 1.25/3",
    ]
    assert p.done == 1.25
    p.result(
        1, {}, epoch_record(val_token_accuracy=0.5, epoch=2.5)
    )  # a trial resumed in this session: since its epoch began
    assert p.done == 1.75
