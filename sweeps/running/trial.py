"""One sweep trial in its Ray worker: Tune's function trainable, and the device it trains on.

Kept apart from :mod:`sweeps.running.runner` (the driver's side: Tune's callbacks, scheduler and
searcher) so that a trial's process imports what training needs: PyTorch, Ray Tune and the
tokenizer's libraries, but neither MLflow nor Optuna (tests/test_layers.py holds it to that).
Every trial's worker pays its imports when it starts."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray import tune
from ray.exceptions import RayActorError
from ray.tune.trainable.function_trainable import FunctionTrainable, wrap_function

from seqae_core.borders import TuneConfig
from seqae_core.checkpoint import Checkpoint, CheckpointStore
from seqae_core.config import Config
from seqae_core.data import shared_settings
from seqae_core.device import describe_precision
from seqae_core.epoch import EpochRecord
from seqae_core.loops import Interrupted, NonFiniteLossError
from seqae_core.members import MemberResult, train_members
from seqae_core.train import train
from seqae_errors import ConfigError
from sweeps.running import ray_private as RP
from sweeps.running.system_metrics import SystemMetrics
from sweeps.running.tune_result import TrialResult, to_tune
from sweeps.spec.trial import TrialSpec, WorkerSpec

# "1": a trial that Ray gave a GPU on a node where torch finds no CUDA device trains on the CPU and
# says so (the GPU is logical: `ray start --num-gpus`, `seqae cluster up --gpus-per-worker`); unset,
# such a trial fails. A rehearsal of GPU scheduling, never a silent fallback.
LOGICAL_GPUS = "SEQAE_LOGICAL_GPUS"
# A pack's report: its members' results, as JSON text (Tune's loggers would try to chart a list of
# them as a TensorBoard histogram, and warn), and [number, error] of each member that failed.
MEMBERS, FAILED = "members", "failed"
DRAIN_POLL_SECONDS = 2.0  # how often a training worker asks Ray whether its node is being drained


class Evicted(RayActorError):
    """A trial that left its node because the node is going away: its worker got SIGTERM (a spot
    instance's notice, Kubernetes' eviction) or Ray drains the node (`ray drain-node`, an
    autoscaler's preemption). Raised as Ray's own word for an actor whose node was preempted, which
    Tune retries without counting it among the trial's failures (seqae's ``retries``): the trial
    continues from its last checkpoint on a node that is not draining."""

    def __init__(self, message: str = "") -> None:
        super().__init__(error_msg=message, preempted=True)


class Leaving:
    """Whether this worker's trial must leave its node, and why; asked before every optimizer step
    (:func:`seqae_core.train.train`'s ``interrupt``). A worker process holds one (:data:`LEAVING`).
    SIGTERM while a trial trains sets it, and drains the node for the rest of its trials (Ray places
    no trial there, so the retry does not land on a node that is going away); a SIGTERM between
    trials, or a second one, exits at once as Ray's own handler does. A thread polls Ray for its
    node being drained while a trial trains, and the trial's store for a user's stop (that one
    ends the trial instead: `seqae sweep stop --trial --now`)."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.signalled = False
        self.trial: int | None = None  # the trial that trains in this worker now
        self.stopping = False  # a user stopped it (`seqae sweep stop --trial --now`): it ends, it does not move
        self.previous: Any = None  # Ray's SIGTERM handler

    def install(self) -> None:
        """Take SIGTERM, on the worker's main thread (the only one Python lets set a handler)."""
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) != self.on_sigterm
        ):
            self.previous = signal.signal(signal.SIGTERM, self.on_sigterm)

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if self.trial is None or self.signalled:
            if callable(self.previous):
                self.previous(signum, frame)
            sys.exit(1)
        self.signalled = True
        self.why = self.why or "its worker received SIGTERM"

    def __call__(self) -> bool:
        return self.why is not None

    @contextmanager
    def training(self, number: int, store: CheckpointStore | None = None) -> Iterator[None]:
        """Trial ``number`` trains in the block: SIGTERM and a drain of its node make it leave; a stop
        asked in its ``store`` (`seqae sweep stop --trial --now`) ends the block, and the trial, there."""
        node = ray.get_runtime_context().get_node_id()
        self.trial, self.why, self.signalled, self.stopping = number, None, False, False
        done = threading.Event()
        watcher = threading.Thread(
            target=self._watch, args=(number, node, done, store), name="seqae-drain-watch", daemon=True
        )
        watcher.start()
        try:
            yield
        except Interrupted as exc:
            if self.stopping:  # Tune sees the trial end; the driver records how (sweeps.stores.ledger.decide)
                print(f"seqae: trial {number}: {self.why}: {exc}", flush=True)
                return
            if self.signalled:
                drain(node, f"seqae: trial {number}'s worker received SIGTERM")
            print(f"seqae: trial {number}: left node {node} ({self.why}): {exc}", flush=True)
            raise Evicted(
                f"trial {number} left node {node} ({self.why}, {exc}); it continues from its last "
                "checkpoint on another node"
            ) from exc
        finally:
            done.set()
            self.trial = None

    def _watch(self, number: int, node: str, done: threading.Event, store: CheckpointStore | None) -> None:
        while not done.wait(DRAIN_POLL_SECONDS):
            try:
                stop = store is not None and store.stop_asked()
            except OSError:  # a storage that does not answer now is asked again at the next poll
                stop = False
            if stop:
                self.stopping = True  # before why, which the training asks
                self.why = "stopped by `seqae sweep stop --trial --now`"
                return
            try:
                draining = node in RP.draining_nodes()
            except Exception:  # noqa: BLE001 - a GCS that does not answer now is asked again at the next poll
                continue
            if draining:
                self.why = self.why or "its node is being drained"
                print(f"seqae: trial {number}: its node is being drained; it leaves before its next step", flush=True)
                return


LEAVING = Leaving()


def drain(node: str, message: str) -> None:
    """Ask Ray to drain ``node`` for preemption: no new work is placed there, and an actor that dies
    there is a preempted one, which Tune does not count among a trial's failures."""
    try:  # with no deadline: whoever stops the node decides when
        RP.drain_for_preemption(node, message)
    except Exception as exc:  # noqa: BLE001 - the trial leaves all the same; it may be retried on this node
        print(f"seqae: could not drain node {node}: {exc}", flush=True)


def take_sigterm() -> None:
    """:data:`LEAVING` takes SIGTERM. A module's function, which Ray pickles by name: the class
    :func:`evictable` makes is pickled by value, with copies of the globals it names, and a copy of
    LEAVING would not be the one the trial's training asks."""
    LEAVING.install()


def evictable(function: Callable[[TuneConfig], None]) -> type[FunctionTrainable]:
    """Tune's trainable of ``function`` (:func:`run_trial` or :func:`run_pack`, through
    ``tune.with_parameters``) whose worker takes SIGTERM (:class:`Leaving`): Tune sets a trainable
    up on its worker's main thread and runs the function on another."""

    class Evictable(wrap_function(function)):  # type: ignore[misc]  # a class Tune makes at run time
        def setup(self, config: TuneConfig, *args: Any, **kwargs: Any) -> None:
            take_sigterm()
            super().setup(config, *args, **kwargs)

    Evictable.__name__ = getattr(function, "__name__", "trainable")
    return Evictable


@dataclass(frozen=True)
class Runtime:
    """What every trial's worker of a session needs besides its trial (``tune.with_parameters``):
    the trials' record ``storage``, the data ``cache_dir`` of a node that fetches none, and the data
    entries the driver ``published`` for the nodes (by :func:`~seqae_core.data.shared_settings`)."""

    storage: str
    cache_dir: str
    published: Mapping[Any, str]


def run_trial(config: TuneConfig, runtime: Runtime) -> None:
    """A Tune function trainable: one sweep trial, continued from its newest valid checkpoint."""
    sys.unraisablehook = exit_quietly_on_stop
    trial = WorkerSpec.of_tune(config).trial
    store = CheckpointStore.of_trial(runtime.storage, trial.number)
    cpus = tune.get_context().get_trial_resources().required_resources.get("CPU", 1)
    torch.set_num_threads(max(1, int(cpus)))
    with store.exclusive():
        verdict = store.verdict()
        if verdict is not None:  # Tune's retries are for lost workers; this error would only repeat
            raise TrialFailed(f"trial {trial.number} already failed in a way a retry cannot fix: {verdict}")
        try:
            if trial.config is None:
                raise ConfigError(trial.error or "the trial has no config")
            _train_trial(trial.number, trial.config, store, runtime, trial.continued)
        except (ConfigError, NonFiniteLossError) as exc:
            store.record_verdict(f"{type(exc).__name__}: {exc}")
            raise


def exit_quietly_on_stop(unraisable: sys.UnraisableHookArgs) -> None:
    """A trial's worker's hook for the exceptions Python cannot raise (``sys.unraisablehook``).
    Ray stops a worker it no longer needs with SIGTERM, and its handler raises SystemExit wherever
    the main thread is. Where that is a weak reference's callback or a finalizer, Python would
    print the exception and its traceback on the user's terminal, through the driver, and carry on.
    The worker was asked to stop: it does, with the exit's code, and prints nothing. Any other
    exception is printed as Python prints it."""
    if isinstance(unraisable.exc_value, SystemExit):
        sys.stdout.flush()
        sys.stderr.flush()
        code = unraisable.exc_value.code
        os._exit(code if isinstance(code, int) else 1)
    sys.__unraisablehook__(unraisable)


class TrialFailed(RuntimeError):
    """A trial that failed for a reason that repeats: its config, or its loss diverging."""


def _train_trial(number: int, trial_config: Config, store: CheckpointStore, runtime: Runtime, continued: bool) -> None:
    resume = _resumed(number, store, continued)
    device, gpu = trial_device(number, trial_config)
    node_id = ray.get_runtime_context().get_node_id()

    def report(record: EpochRecord, checkpoint: Checkpoint) -> None:
        store.save(record, checkpoint)
        tune.report(to_tune(TrialResult(number, record, checkpoint.finished, {"node_id": node_id}, gpu)))

    # Data the driver published is fetched into this node's own cache (SEQAE_CACHE_DIR), once per node.
    published = runtime.published.get(shared_settings(trial_config.data))
    cache_dir = None if published else runtime.cache_dir
    with (
        SystemMetrics() as usage,
        LEAVING.training(number, store),
    ):  # each record carries the machine's CPU, memory and GPU use
        train(
            trial_config,
            report,
            resume=resume,
            device=device,
            cache_dir=cache_dir,
            published=published,
            measure=usage.epoch,
            interrupt=LEAVING,
        )


def _resumed(number: int, store: CheckpointStore, continued: bool) -> Checkpoint | None:
    """Trial ``number``'s newest valid checkpoint (None: it starts from epoch 1), and what the
    user is told of it: the damaged records skipped, where it continues, or that it starts over."""
    resume, skipped = store.resume()
    for note in skipped:
        print(f"seqae: trial {number}: skipped damaged checkpoint {note}", flush=True)
    if resume is not None:
        print(f"seqae: trial {number}: continuing {resume.place}", flush=True)
    elif skipped or continued:
        print(f"seqae: trial {number}: no valid checkpoint left; starting over from epoch 1", flush=True)
    return resume


def run_pack(config: TuneConfig, runtime: Runtime) -> None:
    """A Tune function trainable: a pack of trials of one shape (``resources.fuse``) trained as one
    batched model (:func:`seqae_core.members.train_members`), each member continued from its own
    newest valid checkpoint. Each validation, one report holds every member's result and the error
    of each that failed alone (read by :class:`sweeps.running.packs.Members`); a member the driver
    stopped leaves before the next part, and a retry of the pack leaves it out."""
    sys.unraisablehook = exit_quietly_on_stop
    pack_id = tune.get_context().get_trial_id()
    specs = WorkerSpec.of_tune(config).pack
    stores = {t.number: CheckpointStore.of_trial(runtime.storage, t.number) for t in specs}
    cpus = tune.get_context().get_trial_resources().required_resources.get("CPU", 1)
    torch.set_num_threads(max(1, int(cpus)))
    with ExitStack() as held:
        for store in stores.values():
            held.enter_context(store.exclusive())
        failed: list[tuple[int, str]] = []
        for spec in specs:
            if spec.config is None:
                error = f"ConfigError: {spec.error or 'the trial has no config'}"
                stores[spec.number].record_verdict(error)
                failed.append((spec.number, error))
            elif (verdict := stores[spec.number].verdict()) is not None:
                failed.append((spec.number, f"TrialFailed: it already failed in a way a retry cannot fix: {verdict}"))
        if failed:
            tune.report({MEMBERS: "[]", FAILED: failed})
        gone = {number for number, _ in failed}
        members = [t for t in specs if t.number not in gone and not stores[t.number].left(pack_id)]
        while members:  # members whose checkpoints stand behind the others' catch up first
            members = _train_pack(members, stores, runtime, pack_id)


def _train_pack(
    specs: list[TrialSpec], stores: dict[int, CheckpointStore], runtime: Runtime, pack_id: str
) -> list[TrialSpec]:
    """Train the pack's ``specs`` from their checkpoints, all of them where they stand at one place;
    otherwise (a pack killed between two members' records) those furthest behind, until they reach
    the next place another stands at. Returns the members left to train: none once all have ended."""
    resumes = {spec.number: _resumed(spec.number, stores[spec.number], spec.continued) for spec in specs}
    places = {
        n: (r.epoch, r.step) if r is not None else (0, 0) for n, r in resumes.items() if r is None or not r.finished
    }
    behind = min(places.values(), default=(0, 0))
    ahead = min((p for p in places.values() if p > behind), default=None)
    group = [t for t in specs if ahead is None or places.get(t.number) == behind]
    device, gpu = trial_device(group[0].number, group[0].config)  # type: ignore[arg-type]  # run_pack left out the unbuilt
    node_id = ray.get_runtime_context().get_node_id()

    def report(results: list[MemberResult]) -> set[int]:
        records, failed = [], []
        for result in results:
            number = group[result.index].number
            if result.error is not None:
                stores[number].record_verdict(result.error)
                failed.append([number, result.error])
            elif result.record is not None and result.checkpoint is not None:
                stores[number].save(result.record, result.checkpoint)
                records.append(
                    to_tune(TrialResult(number, result.record, result.checkpoint.finished, {"node_id": node_id}, gpu))
                )
        tune.report({MEMBERS: json.dumps(records), FAILED: failed})
        caught_up = {
            r.index
            for r in results
            if ahead is not None and r.checkpoint is not None and (r.checkpoint.epoch, r.checkpoint.step) >= ahead
        }
        return caught_up | {i for i, spec in enumerate(group) if stores[spec.number].left(pack_id)}

    configs = [t.config for t in group if t.config is not None]
    published = runtime.published.get(shared_settings(configs[0].data))
    with SystemMetrics() as usage, LEAVING.training(group[0].number):  # each record: the machine's CPU, memory, GPU use
        train_members(
            configs,
            report,
            resumes=[resumes[t.number] for t in group],
            device=device,
            cache_dir=None if published else runtime.cache_dir,
            published=published,
            measure=usage.epoch,
            interrupt=LEAVING,
        )
    if ahead is None:
        return []
    return [t for t in specs if not stores[t.number].left(pack_id) and stores[t.number].verdict() is None]


def trial_device(number: int, config: Config) -> tuple[str, dict[str, str]]:
    """The device trial ``number`` trains on, and what its run records of the GPUs Ray assigned it
    (``{}`` without any): ``gpu`` (``cuda``, or ``logical`` where it trains on the CPU instead), the
    ids ``ray.get_gpu_ids()`` gives and the ``CUDA_VISIBLE_DEVICES`` Ray set from them. Only the
    GPUs Ray assigned are visible, so a GPU trial trains on ``cuda``; on a node without CUDA its
    GPU is logical, which fails the trial unless ``SEQAE_LOGICAL_GPUS=1`` makes it a rehearsal."""
    ids = ",".join(str(i) for i in ray.get_gpu_ids())
    if not ids:
        return "cpu", {}
    given = {"gpu_ids": ids, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "unset")}
    if torch.cuda.is_available():
        return "cuda", {"gpu": "cuda", **given}
    assigned = f"Ray assigned it GPU {ids} (CUDA_VISIBLE_DEVICES={given['cuda_visible_devices']})"
    if os.environ.get(LOGICAL_GPUS) != "1":
        raise ConfigError(
            f"trial {number}: {assigned}, but torch finds no CUDA device on this node: the GPU is "
            f"logical (`ray start --num-gpus`). Run GPU sweeps on nodes with GPUs, set resources.gpu=0 "
            f"to train on CPUs, or set {LOGICAL_GPUS}=1 to rehearse GPU scheduling with trials that "
            "train on the CPU"
        )
    print(
        f"seqae: trial {number}: {assigned}, a logical GPU: this node has no CUDA device, so it trains on the "
        f"CPU instead, in {describe_precision(config, torch.device('cpu'))}; {LOGICAL_GPUS}=1 makes it a rehearsal "
        "of GPU scheduling, its cost counted in GPU-hours",
        flush=True,
    )
    return "cpu", {"gpu": "logical", **given}
