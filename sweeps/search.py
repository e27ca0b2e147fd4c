"""The sweep's Optuna study: the durable record of which trials exist and how they ended.

A sweep trial *is* an Optuna trial; its number is the trial's identity everywhere (checkpoint
folder, MLflow run, Tune trial name). Grid cells are enqueued as fixed parameters, searched keys
are sampled. Because the study lives in persistent storage, a new driver rebuilds everything
from it: trials that finished are never re-run, interrupted ones (still RUNNING) are continued
from their checkpoints, and new ones are asked for until the planned total is reached.

Only the one driver that holds the sweep's lock writes to the study, which also keeps SQLite
out of concurrent-writer trouble.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from seqae_core import metrics as M
from seqae_core.config import ConfigError
from sweeps.spec import Distribution, SweepSpec

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

FINAL = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


@dataclass(frozen=True)
class TrialPlan:
    """A trial to run: its number and the config values it sets."""

    number: int
    params: dict[str, Any]
    continued: bool = False  # an interrupted trial, to continue from its checkpoint


def storage(url: str) -> optuna.storages.BaseStorage:
    if url.startswith("sqlite:"):
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})
    return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})


def sampler(spec: SweepSpec, total: int) -> optuna.samplers.BaseSampler:
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    if spec.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=spec.seed, population_size=max(2, min(50, total // 3)))
    return optuna.samplers.TPESampler(seed=spec.seed)


def study_exists(url: str, name: str) -> bool:
    return name in optuna.study.get_all_study_names(storage(url))


def best_epoch_values(spec: SweepSpec, history: list[dict[str, Any]]) -> list[float]:
    """The objective values of a trial: its metrics at the epoch early stopping kept."""
    best = max(history, key=lambda h: (h[M.MONITOR], -h[M.EPOCH]))
    return [float(best[o.metric]) for o in spec.objectives]


def read_only(spec: SweepSpec, url: str, name: str) -> SweepStudy:
    """A sweep's study, for reading (status, reports): loaded without writing anything, so a
    read-only workspace still shows what it holds. Before the sweep starts, it is empty."""
    view = SweepStudy.__new__(SweepStudy)
    view.spec, view.total, view._issued = spec, 0, set()
    try:
        view.study = optuna.load_study(study_name=name, storage=storage(url))
    except KeyError:  # the sweep was recorded but its driver has not created the study yet
        view.study = optuna.create_study(directions=["maximize" if o.mode == "max" else "minimize"
                                                     for o in spec.objectives])
    return view


class SweepStudy:
    def __init__(self, spec: SweepSpec, url: str, name: str, total: int, fingerprint: str) -> None:
        self.spec, self.total = spec, total
        directions: list[Any] = ["maximize" if o.mode == "max" else "minimize" for o in spec.objectives]
        self.study = optuna.create_study(
            storage=storage(url), study_name=name, directions=directions, sampler=sampler(spec, total),
            load_if_exists=True,
        )
        owner = self.study.user_attrs.get("seqae.fingerprint")
        if owner is None:
            self.study.set_user_attr("seqae.fingerprint", fingerprint)
        elif owner != fingerprint:
            raise ConfigError(f"the Optuna study {name!r} belongs to another sweep (fingerprint {owner}); "
                              "choose another --name")
        self._issued: set[int] = set()

    # -- the trials --------------------------------------------------------------------------
    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for trial in self.trials():
            counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
        return counts

    def reconcile(self, finished_history: Callable[[int], list[dict[str, Any]] | None]) -> list[str]:
        """Bring the study up to date after a driver died, before any new trial starts.

        ``finished_history(n)`` returns the metric history of trial n if its checkpoints say it
        finished training. Such trials are completed in place; other RUNNING trials are left
        RUNNING, to be continued; WAITING ones (enqueued, never started) get their parameters."""
        notes = []
        for trial in self.trials():
            if trial.state == TrialState.WAITING:
                self._start_waiting()
                notes.append(f"trial {trial.number}: enqueued before the driver stopped; it will run now")
        for trial in self.trials():
            if trial.state != TrialState.RUNNING:
                continue
            history = finished_history(trial.number)
            if history:
                self.study.tell(trial.number, best_epoch_values(self.spec, history), skip_if_finished=True)
                notes.append(f"trial {trial.number}: had finished training; recorded as complete")
            else:
                notes.append(f"trial {trial.number}: was interrupted; it will continue from its checkpoint")
        return notes

    def next_plan(self) -> TrialPlan | None:
        """An interrupted trial to continue, else a new trial while the budget lasts, else None."""
        trials = self.trials()
        for trial in trials:
            if trial.state == TrialState.RUNNING and trial.number not in self._issued:
                self._issued.add(trial.number)
                return TrialPlan(trial.number, dict(trial.params), continued=True)
        if len(trials) >= self.total:
            return None
        cell = self._emptiest_cell(trials)
        if cell:
            self.study.enqueue_trial(cell)
        asked = self.study.ask()
        params = self._suggest(asked)
        self._issued.add(asked.number)
        return TrialPlan(asked.number, params)

    def remaining(self) -> int:
        """How many trials a session still has to run: unfinished ones plus those not yet created."""
        trials = self.trials()
        unfinished = sum(t.state not in FINAL for t in trials)
        return unfinished + max(0, self.total - len(trials))

    def _start_waiting(self) -> None:
        trial = self.study.ask()  # pops the oldest WAITING trial, with its fixed parameters
        self._suggest(trial)

    def _emptiest_cell(self, trials: list[optuna.trial.FrozenTrial]) -> dict[str, Any]:
        cells = self.spec.cells()
        if cells == [{}]:
            return {}
        filled = [sum(all(t.params.get(k) == v for k, v in cell.items()) for t in trials) for cell in cells]
        return cells[filled.index(min(filled))]

    def _suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        params = {key: trial.suggest_categorical(key, list(values)) for key, values in self.spec.grid_keys().items()}
        for key, dist in self.spec.search.items():
            params[key] = _suggest_one(trial, key, dist)
        return params

    # -- outcomes ----------------------------------------------------------------------------
    def report(self, number: int, epoch: int, metrics: dict[str, Any]) -> None:
        """An epoch's objective value, as an intermediate value (single-objective sweeps)."""
        if self.spec.multi_objective:
            return
        trial = self._running(number)
        # Tune may hand a trial's last result to both of the searcher's hooks: report it once.
        if trial is not None and epoch not in trial.intermediate_values:
            optuna.trial.Trial(self.study, trial._trial_id).report(float(metrics[self.spec.objectives[0].metric]), epoch)

    def complete(self, number: int, history: list[dict[str, Any]]) -> None:
        self.study.tell(number, best_epoch_values(self.spec, history), skip_if_finished=True)

    def prune(self, number: int) -> None:
        self.study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)

    def fail(self, number: int) -> None:
        self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)

    def note_tune_trial(self, number: int, tune_trial_id: str) -> None:
        trial = self._running(number)
        if trial is not None:
            ids = list(trial.user_attrs.get("seqae.tune_trial_ids", []))
            if tune_trial_id not in ids:
                self.study._storage.set_trial_user_attr(trial._trial_id, "seqae.tune_trial_ids", ids + [tune_trial_id])

    def state(self, number: int) -> TrialState:
        return self.study._storage.get_trial(self.study._storage.get_trial_id_from_study_id_trial_number(
            self.study._study_id, number)).state

    def _running(self, number: int) -> optuna.trial.FrozenTrial | None:
        for trial in self.trials():
            if trial.number == number:
                return trial if trial.state == TrialState.RUNNING else None
        return None

    def best(self) -> list[optuna.trial.FrozenTrial]:
        """The best trial, or the Pareto front of a multi-objective sweep."""
        if not any(t.state == TrialState.COMPLETE for t in self.trials()):
            return []
        return self.study.best_trials if self.spec.multi_objective else [self.study.best_trial]


def _suggest_one(trial: optuna.Trial, key: str, dist: Distribution) -> Any:
    if dist.kind == "categorical":
        return trial.suggest_categorical(key, list(dist.choices))
    assert dist.low is not None and dist.high is not None  # numeric distributions have bounds
    if dist.kind == "int":
        return trial.suggest_int(key, int(dist.low), int(dist.high), step=dist.step or 1, log=dist.log)
    return trial.suggest_float(key, float(dist.low), float(dist.high), log=dist.log)
