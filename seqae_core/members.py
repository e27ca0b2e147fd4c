"""A sweep's trials of one shape trained as one pack: ``train_members(configs, report)``.

Configs that share a :func:`seqae_core.config.fusion_key` (they differ at most in
:data:`seqae_core.config.FREE_KEYS`: learning rate, schedule, weight decay, seed, patience) train as
one batched model, each member with its own hyperparameters, batches, early stopping and history:
what each member reports is what :func:`seqae_core.train.train` of its config alone reports, its
timings aside (its share of the pack's). A member leaves when it finishes, runs out of patience,
fails (a non-finite loss fails it alone) or the report says so (a sweep's scheduler stopped it);
the others train on in a smaller pack.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from seqae_core.checkpoint import Checkpoint
from seqae_core.config import FREE_KEYS, Config, fusion_key
from seqae_core.device import pick_device
from seqae_core.loops import Interrupt
from seqae_core.loss import plan_head
from seqae_core.train import MemberResult, PackReport, Run, Summary, load_data, train_runs, validation_steps
from seqae_errors import ConfigError

__all__ = ["MemberResult", "PackReport", "train_members"]


def train_members(
    configs: list[Config],
    report: PackReport | None = None,
    *,
    resumes: list[Checkpoint | None] | None = None,
    device: str | None = None,
    cache_dir: Any = None,
    published: str | None = None,
    progress: bool = False,
    measure: Callable[[], dict[str, float]] | None = None,
    interrupt: Interrupt | None = None,
) -> list[Summary | None]:
    """Train ``configs`` as one pack; return each member's final metrics (as :func:`seqae_core.train.train`
    returns them), None for one that failed or never validated.

    ``report`` is called once a validation with a :class:`MemberResult` for each member that trained
    the part (a failed one's with its error), and returns the indices of the members that leave
    now. ``resumes[i]``: member i's checkpoint, as ``train(resume=...)`` takes it; the members that
    train on must stand at one place, and one whose checkpoint is finished is not trained (its
    summary is returned). The other arguments are :func:`seqae_core.train.train`'s, for all members.
    Raises :class:`ConfigError` for configs that cannot share a pack, naming the key and the values.
    """
    _check_members(configs)
    resumes = resumes if resumes is not None else [None] * len(configs)
    if len(resumes) != len(configs):
        raise ConfigError(
            f"train_members: {len(resumes)} resumes for {len(configs)} configs: give one per config "
            "(None for a fresh start)"
        )
    shared = configs[0]
    dev = pick_device(device)
    plan = plan_head(shared.train.head, dev)  # a head this machine cannot run is refused before the data loads
    splits, data_seconds = load_data(shared, dev, cache_dir, published)
    steps_per_epoch = math.ceil(len(splits.train) / shared.train.batch_size)
    checks = validation_steps(shared.train, steps_per_epoch)
    runs = [
        Run.start(config, resume, splits, dev, plan, steps_per_epoch, checks)
        for config, resume in zip(configs, resumes)
    ]
    places = {i: run.place for i, run in enumerate(runs) if not run.done}
    if len(set(places.values())) > 1:
        where = ", ".join(f"member {i} {_place(epoch, step)}" for i, (epoch, step) in places.items())
        raise ConfigError(
            f"train_members: the members to train stand at different places ({where}): a pack's "
            "members take each step together; resume them in packs of one place"
        )
    train_runs(
        runs,
        splits,
        dev,
        plan,
        steps_per_epoch,
        checks,
        report or (lambda results: set()),
        fused=True,
        members=True,
        data_seconds=data_seconds,
        progress=progress,
        measure=measure,
        interrupt=interrupt,
    )
    return [run.summary(data_seconds) if run.history and run.error is None else None for run in runs]


def _place(epoch: int, step: int) -> str:
    """Where a run that trains ``epoch`` next, ``step`` steps into it, stands, as :attr:`Checkpoint.place` says it."""
    if step:
        return f"at step {step} of epoch {epoch}"
    return f"after epoch {epoch - 1}" if epoch > 1 else "at the start"


def _check_members(configs: list[Config]) -> None:
    """Refuse configs that cannot train as one pack, in one line naming the key and the values."""
    if not configs:
        raise ConfigError("train_members: no configs to train")
    for key, allowed in (("train.repeats", lambda v: v == 1), ("train.compile", lambda v: v != "on")):
        values = [config.flat()[key] for config in configs]
        if not all(allowed(v) for v in values):
            raise ConfigError(
                f"train_members: {key}={values!r}: a pack's members train one seed each, eagerly "
                "(train.repeats=1, train.compile off or auto)"
            )
    keys = [dict(fusion_key(config)) for config in configs]
    for key in keys[0]:
        values = [k[key] for k in keys]
        if len({repr(v) for v in values}) > 1:
            raise ConfigError(
                f"train_members: the configs differ in {key} ({', '.join(map(repr, values))}): a pack's "
                f"members may differ only in {', '.join(FREE_KEYS)}"
            )
