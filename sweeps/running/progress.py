"""What a person sees while a sweep runs: one line per trial result, a bar for the whole sweep,
and a table of every trial at the end.

    trial 3  epoch 2/3  lr=1.9e-03 d_model=128 d_attn=64  val_token_accuracy 0.9712  best 0.9750 (trial 1)  1:23 elapsed  ~2:10 left

The bar is tqdm's (it draws only on a terminal; in a log file the lines stand alone). The time
left is the sweep's remaining trial-epochs at the rate seen so far, so early stops and pruning
only ever make it shorter. A trial that validates between epochs' ends (train.validate_every)
prints a line at each validation, its epochs trained a fraction (``epoch 1.25/3``).
"""  # noqa: E501 - the line above is one as it prints, whole

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from seqae_core import metrics as M
from seqae_core import names as N
from seqae_core.config import Flat, FlatValue
from seqae_core.epoch import EpochRecord
from sweeps.spec.sections import Objective

LINES = logging.getLogger("sweeps.running.progress")  # the driver's lines, shown where a user asked for them (show)


def say(line: str) -> None:
    """A line of the driver's (``seqae: ...``): printed once :func:`show` was called, else dropped,
    so that a Python session that did not ask for them sees none."""
    LINES.info(line)


class _Stdout(logging.Handler):
    """Each line on the standard output of the moment, above tqdm's bar on a terminal: a notebook
    cell's or a test's redirected ``sys.stdout`` gets it, and a log file gets it at once."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stdout)
        sys.stdout.flush()


def show() -> None:
    """Print the driver's progress lines from now on (the command line does; Python asks)."""
    if not any(isinstance(h, _Stdout) for h in LINES.handlers):
        LINES.addHandler(_Stdout())
    LINES.setLevel(logging.INFO)
    LINES.propagate = False  # not again on stderr, where the command line sends other log lines


def short(params: Mapping[str, FlatValue]) -> str:
    """``{"train.lr": 0.00186, "model.d_model": 128}`` -> ``lr=1.9e-03 d_model=128``."""
    parts = []
    for key, value in params.items():
        if isinstance(value, float) and value != 0 and not 0.01 <= abs(value) < 1000:
            value = f"{value:.1e}"
        elif isinstance(value, float):
            value = f"{value:.3g}"
        parts.append(f"{key.split('.')[-1]}={value}")
    return " ".join(parts)


def clock(seconds: float) -> str:
    """1:23 or 1:02:03."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Lines and a bar for one session of a sweep; ``work`` is its trial-epochs still to run."""

    def __init__(
        self, name: str, objective: Objective, work: int, epochs: int, best: tuple[float, int] | None = None
    ) -> None:
        self.objective, self.epochs, self.best = objective, epochs, best
        self.started = time.monotonic()
        self.done = 0.0  # trial-epochs trained, fractions of an epoch included
        self.last: dict[int, float] = {}  # each trial's epochs trained at its latest result
        self.work: float = max(work, 1)
        self.bar = tqdm(
            total=self.work,
            desc=f"sweep {name}",
            unit="epoch",
            disable=None,
            leave=False,
            dynamic_ncols=True,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} trial-epochs [{elapsed}<{remaining}]",
        )

    def _better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value > self.best[0] if self.objective.mode == "max" else value < self.best[0]

    def left(self) -> float | None:
        """Seconds the remaining trial-epochs take at the rate seen so far (None before the first)."""
        if not self.done:
            return None
        return (self.work - self.done) * (time.monotonic() - self.started) / self.done

    def result(
        self, number: int, params: Mapping[str, FlatValue], record: EpochRecord, start: str | None = None
    ) -> str:
        """Record a result and print its line (a starting point's shows its name before its
        parameters); returns the line. It adds the epochs trained since the trial's previous
        result (one a result by default; a trial's first in this session: since its epoch began)."""
        epoch = float(record.epoch)
        trained = epoch - self.last.get(number, math.ceil(epoch) - 1)
        self.last[number] = epoch
        self.done = min(self.done + trained, self.work)
        self.bar.update(trained)
        value = record.value(self.objective.metric)
        if self._better(value):
            self.best = (value, number)
        assert self.best is not None
        left = self.left()
        line = (
            f"trial {number}  epoch {M.epoch_text(epoch)}/{self.epochs}  "
            f"{f'start {start}: ' if start else ''}{short(params)}  "
            f"{self.objective.metric} {M.value_text(value, record.spread, self.objective.metric)}  "
            f"best {self.best[0]:.4f} (trial {self.best[1]})  "
            f"{clock(time.monotonic() - self.started)} elapsed" + (f"  ~{clock(left)} left" if left is not None else "")
        )
        say(line)
        return line

    def ended(self, number: int, epochs_run: float, how: str, why: str | None = None) -> None:
        """A trial ended (``how``: finished, stopped by the scheduler or the budget, failed; ``why``: the error):
        the epochs it will not run leave the sweep's remaining work."""
        self.work = max(self.work - max(self.epochs - epochs_run, 0), self.done, 1)
        self.bar.total = self.work
        self.bar.refresh()
        say(
            f"trial {number}  {how} after {M.epoch_text(epochs_run)} epoch{'s' if epochs_run != 1 else ''}"
            + (f": {why}" if why else "")
        )

    def close(self) -> None:
        self.bar.close()


def summary(trials: list[Any], objectives: tuple[Objective, ...], values_of: Callable[[Flat], Flat] = dict) -> str:
    """A table of every trial of the study, best first (:func:`summary_rows`), as plain text."""
    return text_table(*summary_rows(trials, objectives, values_of))


def summary_rows(
    trials: list[Any], objectives: tuple[Objective, ...], values_of: Callable[[Flat], Flat] = dict
) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a table of every trial of the study, best first: trial, state,
    epochs trained at its latest result (a fraction, 0.4, where a trial validates between epochs'
    ends and stopped there; "-" for multi-objective sweeps, which report none), objective values,
    the test token accuracy of the checkpoint each kept (with a test split) and parameters; a
    starting point is named beside its number. ``trials`` are Optuna FrozenTrials, ``values_of``
    their parameters' config values (:meth:`~sweeps.spec.sweep.SweepSpec.values_of`)."""
    first = objectives[0]
    sign = -1.0 if first.mode == "max" else 1.0

    def order(trial: Any) -> tuple[float, int]:
        return (sign * trial.values[0] if trial.values else float("inf"), trial.number)

    tested = any(N.TEST in t.user_attrs for t in trials)

    def trained(trial: Any) -> str:
        # A trial recorded before seqae kept N.TRAINED shows its result count: its epochs, unless it
        # validated between epochs' ends (possible in the one release before N.TRAINED).
        epochs = trial.user_attrs.get(N.TRAINED, len(trial.intermediate_values))
        return M.epoch_text(epochs) if epochs else "-"

    header = [
        "trial",
        "state",
        "epochs",
        *(o.metric for o in objectives),
        *([M.TEST_TOKEN_ACCURACY] if tested else []),
        "params",
    ]
    rows = [
        [
            f"{t.number} ({t.user_attrs[N.START]})" if N.START in t.user_attrs else str(t.number),
            t.state.name,
            trained(t),
            *(
                [M.value_text(v, t.user_attrs.get(N.SEEDS, {}), o.metric) for o, v in zip(objectives, t.values)]
                if t.values
                else ["-"] * len(objectives)
            ),
            *([_test(t)] if tested else []),
            short(values_of(t.params)),
        ]
        for t in sorted(trials, key=order)
    ]
    return header, rows


def best_line(best: list[Any], objectives: tuple[Objective, ...]) -> str:
    """The best trial's validation value (what the search selected on) beside its test token
    accuracy (pages nothing selected on), or why there is none."""
    if len(best) != 1:
        return f"{len(best)} trials on the Pareto front" if best else "no trial completed"
    trial, objective = best[0], objectives[0]
    test, seeds = trial.user_attrs.get(N.TEST), trial.user_attrs.get(N.SEEDS, {})
    return (
        f"best: trial {trial.number}  {objective.metric} {M.value_text(trial.values[0], seeds, objective.metric, seeds=True)} "
        "(validation, selected on)  "
        + (
            f"{M.TEST_TOKEN_ACCURACY} {M.value_text(test[M.TEST_TOKEN_ACCURACY], seeds, M.TEST_TOKEN_ACCURACY, seeds=True)} "
            "(test pages, never selected on)"
            if test
            else "no test split (data.test_fraction is 0): the validation value is biased by the selection"
        )
    )


def _test(trial: Any) -> str:
    test = trial.user_attrs.get(N.TEST)
    return (
        M.value_text(test[M.TEST_TOKEN_ACCURACY], trial.user_attrs.get(N.SEEDS, {}), M.TEST_TOKEN_ACCURACY)
        if test
        else "-"
    )


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Plain text columns, left-aligned, two spaces apart (rich's table, rendered without colour
    or borders, for a terminal or a log alike)."""
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style=None)
    for column in header:
        table.add_column(column, no_wrap=True, overflow="ignore")
    for row in rows:
        table.add_row(*row)
    console = Console(width=100_000, no_color=True, highlight=False, color_system=None, soft_wrap=False)
    with console.capture() as captured:
        console.print(table)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())
