"""One sweep trial in its Ray worker: Tune's function trainable, and the device it trains on.

Kept apart from :mod:`sweeps.running.runner` (the driver's side: Tune's callbacks, scheduler and
searcher) so that a trial's process imports what training needs: PyTorch, Ray Tune and the
tokenizer's libraries, but neither MLflow nor Optuna (tests/test_layers.py holds it to that).
Every trial's worker pays its imports when it starts."""

from __future__ import annotations

import json
import os
import sys
from contextlib import ExitStack
from typing import Any

import ray
import torch
from ray import tune

from seqae_core.checkpoint import Checkpoint, CheckpointStore
from seqae_core.config import Config
from seqae_core.data import shared_settings
from seqae_core.members import MemberResult, train_members
from seqae_core.train import NonFiniteLossError, describe_precision, train
from seqae_errors import ConfigError
from sweeps.running.system_metrics import SystemMetrics
from sweeps.spec.trial import TrialSpec

# "1": a trial that Ray gave a GPU on a node where torch finds no CUDA device trains on the CPU and
# says so (the GPU is logical: `ray start --num-gpus`, `seqae cluster up --gpus-per-worker`); unset,
# such a trial fails. A rehearsal of GPU scheduling, never a silent fallback.
LOGICAL_GPUS = "SEQAE_LOGICAL_GPUS"
# A pack's report: its members' results, as JSON text (Tune's loggers would try to chart a list of
# them as a TensorBoard histogram, and warn), and [number, error] of each member that failed.
MEMBERS, FAILED = "members", "failed"


def run_trial(config: dict[str, Any], runtime: dict[str, Any]) -> None:
    """A Tune function trainable: one sweep trial, continued from its newest valid checkpoint."""
    sys.unraisablehook = exit_quietly_on_stop
    trial: TrialSpec = config["trial"]
    store = CheckpointStore.of_trial(runtime["storage"], trial.number)
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


def _train_trial(number: int, trial_config: Config, store: CheckpointStore, runtime: dict[str, Any],
                 continued: bool) -> None:
    resume = _resumed(number, store, continued)
    device, gpu = trial_device(number, trial_config)
    node_id = ray.get_runtime_context().get_node_id()

    def report(metrics: dict[str, Any], checkpoint: Checkpoint) -> None:
        store.save(metrics, checkpoint)
        tune.report({**metrics, "trial": number, "node_id": node_id, **gpu, "finished": checkpoint.finished})

    # Data the driver published is fetched into this node's own cache (SEQAE_CACHE_DIR), once per node.
    published = runtime["published"].get(shared_settings(trial_config.data))
    cache_dir = None if published else runtime["cache_dir"]
    with SystemMetrics() as usage:  # each epoch's record carries the machine's CPU, memory and GPU use
        train(trial_config, report, resume=resume, device=device, cache_dir=cache_dir, published=published,
              measure=usage.epoch)


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


def run_pack(config: dict[str, Any], runtime: dict[str, Any]) -> None:
    """A Tune function trainable: a pack of trials of one shape (``resources.fuse``) trained as one
    batched model (:func:`seqae_core.members.train_members`), each member continued from its own
    newest valid checkpoint. Each validation, one report holds every member's result and the error
    of each that failed alone (read by :class:`sweeps.running.packs.Members`); a member the driver
    stopped leaves before the next part, and a retry of the pack leaves it out."""
    sys.unraisablehook = exit_quietly_on_stop
    pack_id = tune.get_context().get_trial_id()
    specs: tuple[TrialSpec, ...] = config["pack"]
    stores = {t.number: CheckpointStore.of_trial(runtime["storage"], t.number) for t in specs}
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


def _train_pack(specs: list[TrialSpec], stores: dict[int, CheckpointStore], runtime: dict[str, Any],
                pack_id: str) -> list[TrialSpec]:
    """Train the pack's ``specs`` from their checkpoints, all of them where they stand at one place;
    otherwise (a pack killed between two members' records) those furthest behind, until they reach
    the next place another stands at. Returns the members left to train: none once all have ended."""
    resumes = {spec.number: _resumed(spec.number, stores[spec.number], spec.continued) for spec in specs}
    places = {n: (r.epoch, r.step) if r is not None else (0, 0) for n, r in resumes.items()
              if r is None or not r.finished}
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
            elif result.metrics is not None and result.checkpoint is not None:
                stores[number].save(result.metrics, result.checkpoint)
                records.append({**result.metrics, "trial": number, "node_id": node_id, **gpu,
                                "finished": result.checkpoint.finished})
        tune.report({MEMBERS: json.dumps(records), FAILED: failed})
        caught_up = {r.index for r in results if ahead is not None and r.checkpoint is not None
                     and (r.checkpoint.epoch, r.checkpoint.step) >= ahead}
        return caught_up | {i for i, spec in enumerate(group) if stores[spec.number].left(pack_id)}

    configs = [t.config for t in group if t.config is not None]
    published = runtime["published"].get(shared_settings(configs[0].data))
    with SystemMetrics() as usage:  # each epoch's record carries the machine's CPU, memory and GPU use
        train_members(configs, report, resumes=[resumes[t.number] for t in group], device=device,
                      cache_dir=None if published else runtime["cache_dir"], published=published, measure=usage.epoch)
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
        raise ConfigError(f"trial {number}: {assigned}, but torch finds no CUDA device on this node: the GPU is "
                          f"logical (`ray start --num-gpus`). Run GPU sweeps on nodes with GPUs, set resources.gpu=0 "
                          f"to train on CPUs, or set {LOGICAL_GPUS}=1 to rehearse GPU scheduling with trials that "
                          "train on the CPU")
    print(f"seqae: trial {number}: {assigned}, a logical GPU: this node has no CUDA device, so it trains on the "
          f"CPU instead, in {describe_precision(config, torch.device('cpu'))}; {LOGICAL_GPUS}=1 makes it a rehearsal "
          "of GPU scheduling, its cost counted in GPU-hours", flush=True)
    return "cpu", {"gpu": "logical", **given}
