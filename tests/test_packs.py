"""Fused trials in a sweep (``resources.fuse``): trials of one shape trained as one batched model in
one Ray Tune trial, each member still its own trial in Optuna, ASHA, MLflow, the checkpoints, the
status and the export; a member that diverges fails alone; a pack killed mid-epoch resumes."""

from __future__ import annotations

import os
import re
import signal

import pandas as pd
import psutil
import pytest
import torch

from seqae_core import metrics as M
from seqae_core.checkpoint import CheckpointStore
from seqae_core.config import from_flat, fusion_key
from seqae_core.train import train
from sweeps.spec import sweep as spec_lib
from sweeps.stores.search import open_study
from tests.refusal import assert_refused
from tests.sweep_helpers import (
    STUDIES,
    held,
    metric_steps,
    mlflow_runs,
    optuna_trials,
    run_args,
    seqae,
    stacks,
    start,
    status,
    trial_metas,
    wait_for,
)
from tests.sweep_helpers import sets as sets_of

# A grid over the learning rate alone, so that a pack of 4 and the same 4 trials one at a time
# train the same configurations in the same order: lr 1e30 drives the loss to NaN; ASHA (grace 1,
# factor 2) decides at epoch 1 on the other three, in trial order. fp32 without dropout: the
# promise of equality within 1e-5.
GRID = [
    "search={}",
    "start={}",
    "grid.train.lr=[1.0e30, 1.0e-2, 3.0e-3, 1.0e-3]",
    "trials={per_cell: 1}",
    "train.lr_schedule=constant",
    "train.precision=fp32",
    "model.dropout=0.0",
    "scheduler={type: asha, grace_period: 1, reduction_factor: 2}",
]


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_pack_is_proposed_with_the_shape_of_its_first_member_and_free_keys_sampled(tmp_path, sampler):
    """The quickstart's space (lr; d_model and d_attn set shapes) in packs of 3: its starting point,
    then the sampler's own proposal, each followed by proposals of the same widths and their own
    learning rates; the sweep's total holds, and each member is an Optuna trial of its own."""
    spec = spec_lib.load(
        STUDIES / "quickstart.yaml", [f"sampler={{type: {sampler}, seed: 0}}", "trials.total=7", "resources.fuse=3"]
    )
    study = open_study(spec, f"sqlite:///{tmp_path}/s.db", "s", 7, "fingerprint")
    packs = []
    while pack := study.next_pack(3):
        packs.append(pack)
        for member in pack:
            study.study.tell(member.number, 0.5)
    assert [len(p) for p in packs] == [3, 3, 1]
    assert packs[0][0].start == "paper_lr" and not any(m.start for m in packs[0][1:])
    for pack in packs:
        assert len({fusion_key(m.config) for m in pack}) == 1
        assert len({m.params["train.lr"] for m in pack}) == len(pack)  # the free key sampled for each
    assert [m.number for p in packs for m in p] == list(range(7))
    assert {(p[0].params["model.d_model"], p[0].params["model.d_attn"]) for p in packs} != {(128, 128)}  # shapes vary


def test_interrupted_trials_are_packed_again_with_those_of_their_shape(tmp_path):
    """A session that ends with its packs' trials still running (a killed driver): the next
    session's packs continue them, each with the interrupted trials of its own shape, and propose
    no new trial before they are all issued."""
    spec = spec_lib.load(
        STUDIES / "quickstart.yaml", ["sampler={type: random, seed: 0}", "trials.total=6", "resources.fuse=3"]
    )
    storage = f"sqlite:///{tmp_path}/s.db"
    first = open_study(spec, storage, "s", 6, "fingerprint")
    interrupted = [first.next_pack(3), first.next_pack(3)]  # asked, never told: RUNNING in Optuna
    assert [len(p) for p in interrupted] == [3, 3]
    assert fusion_key(interrupted[0][0].config) != fusion_key(interrupted[1][0].config)
    first.study.tell(interrupted[0][1].number, 0.5)  # one finished: a pack of the first shape has room
    del interrupted[0][1]
    again = open_study(spec, storage, "s", 6, "fingerprint")
    continued = [again.next_pack(3), again.next_pack(3)]
    assert (
        [[m.number for m in p] for p in continued]
        == [[m.number for m in p] for p in interrupted]
        == [[0, 2], [3, 4, 5]]
    )
    assert all(m.continued for p in continued for m in p)
    assert [[m.params for m in p] for p in continued] == [[m.params for m in p] for p in interrupted]
    assert again.next_pack(3) == []  # the total is reached: nothing new


@pytest.mark.parametrize(
    "sets, says",
    [
        (
            ["resources.fuse=4", "search={model.d_model: {type: categorical, choices: [64, 128]}}", "start={}"],
            "resources.fuse=4 packs trials that differ only in train.lr",
        ),
        (["resources.fuse=4", "train.repeats=2"], "which train.repeats=2 cannot be"),
        (["resources.fuse=0"], "resources.fuse"),
    ],
)
def test_a_sweep_that_cannot_fuse_is_refused_in_one_line_before_anything_is_made(tmp_path, sets, says):
    workspace = tmp_path / "ws"
    run = seqae("sweep", "run", str(STUDIES / "quickstart.yaml"), "--workspace", str(workspace), *sets_of(*sets))
    assert_refused(run.returncode, run.stderr, says, created=(workspace,))


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The grid fused into one pack of 4, and the same grid trial by trial."""
    root = tmp_path_factory.mktemp("packs")
    runs = {}
    for name, fuse in (("fused", 4), ("alone", 1)):
        run = seqae(*run_args(root / name, name, *GRID, f"resources.fuse={fuse}"))
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        runs[name] = (root / name, run)
    return runs


@pytest.mark.slow
def test_a_pack_ends_with_the_trials_values_and_decisions_of_its_members_run_alone(sweeps):
    """Each member: the same state, every epoch's losses within 1e-5 and its value (validation token
    accuracy) within a token, and its kept checkpoint's test scores likewise, as the trial trained
    alone; ASHA stopped at least one member at its first rung while another trained on; the
    diverging member failed alone. (A batched matmul sums in another order: a token whose two top
    logits tie within rounding may go either way, so accuracies are held to a token, losses to 1e-5.)"""
    trials = {name: {t.number: t for t in optuna_trials(workspace, name)} for name, (workspace, _) in sweeps.items()}
    records = {name: trial_metas(workspace / "sweeps" / name) for name, (workspace, _) in sweeps.items()}
    assert sorted(trials["fused"]) == sorted(trials["alone"]) == [0, 1, 2, 3]
    assert sorted(records["fused"]) == sorted(records["alone"]) == [1, 2, 3]  # the diverging one has none
    for number, alone in trials["alone"].items():
        fused = trials["fused"][number]
        assert fused.params == alone.params and fused.state == alone.state, number
        assert sorted(fused.intermediate_values) == sorted(alone.intermediate_values), number
        for epoch, value in alone.intermediate_values.items():
            assert fused.intermediate_values[epoch] == pytest.approx(value, abs=5e-4), (number, epoch)
        for key, value in alone.user_attrs.get("seqae.test", {}).items():
            assert fused.user_attrs["seqae.test"][key] == pytest.approx(value, abs=5e-4), (number, key)
    for number, meta in records["alone"].items():
        for mine, theirs in zip(records["fused"][number]["history"], meta["history"], strict=True):
            for loss in (M.TRAIN_LOSS, M.VAL_LOSS, M.TEST_LOSS):
                assert mine[loss] == pytest.approx(theirs[loss], abs=1e-5), (number, mine[M.EPOCH], loss)
    states = {n: t.state.name for n, t in trials["fused"].items()}
    assert states[0] == "FAIL"
    assert "PRUNED" in states.values() and "COMPLETE" in states.values(), states
    assert all(len(t.intermediate_values) == 1 for t in trials["fused"].values() if t.state.name == "PRUNED")
    assert all(len(t.intermediate_values) == 2 for t in trials["fused"].values() if t.state.name == "COMPLETE")


@pytest.mark.slow
def test_every_member_is_its_own_trial_where_a_user_looks(sweeps):
    """One Tune trial trained the pack; Optuna, MLflow (a child run per member, counted through its
    client), the checkpoints, the progress lines, the status and the export have a trial per member,
    the diverging one named failed with its error."""
    workspace, run = sweeps["fused"]
    tune_trials = sorted(
        p.name
        for p in (workspace / "sweeps" / "fused" / "tune").glob("session-*/*")
        if p.is_dir() and p.name.startswith(("pack-", "trial-"))
    )
    assert tune_trials == ["pack-0000-of-4"], tune_trials
    trials = optuna_trials(workspace, "fused")
    states = {t.number: t.state.name for t in trials}
    children = {
        int(r.data.tags["seqae.trial"]): r for r in mlflow_runs(workspace, "fused") if "seqae.trial" in r.data.tags
    }
    assert sorted(children) == [0, 1, 2, 3]
    # Each member's run names the one Tune trial that trained the pack, as Optuna records it.
    (pack_id,) = {tuple(t.user_attrs["seqae.tune_trial_ids"]) for t in trials}
    assert {child.data.tags["ray.tune_trial_id"] for child in children.values()} == set(pack_id), pack_id
    for number, child in children.items():
        assert child.data.tags["optuna.trial_number"] == str(number)
        epochs = {"COMPLETE": [1, 2], "PRUNED": [1], "FAIL": []}[states[number]]
        assert metric_steps(child.info.run_id, "val_token_accuracy", workspace) == epochs, number
        if epochs:
            assert child.data.metrics["pack_members"] >= 1 and child.info.status == "FINISHED"
    assert children[0].info.status == "FAILED" and "NonFiniteLossError" in children[0].data.tags["seqae.error"]
    assert re.search(
        r"^trial 0  failed after 0 epochs: NonFiniteLossError: training loss is not finite", run.stdout, re.M
    ), run.stdout[-3000:]
    assert re.search(r"^trial \d  stopped by the scheduler after 1 epochs?$", run.stdout, re.M), run.stdout[-3000:]
    storage = workspace / "sweeps" / "fused"
    assert sorted(trial_metas(storage)) == [1, 2, 3]  # each trained member's own records; the failed one has none
    info = status("fused", workspace)
    assert info["trials_by_state"] == {s: list(states.values()).count(s) for s in set(states.values())}
    out = workspace.parent / "fused-trials.csv"
    exported = seqae("sweep", "export", "fused", "--workspace", str(workspace), "--out", str(out))
    assert exported.returncode == 0, exported.stderr[-2000:]
    rows = pd.read_csv(out)
    assert sorted(rows["trial"]) == [0, 1, 2, 3]
    assert dict(zip(rows["trial"], rows["state"])) == states


@pytest.mark.slow
def test_a_pack_killed_mid_epoch_resumes_each_member_from_its_own_checkpoint(tmp_path, data_cache):
    """SIGKILL of the pack's worker halfway into epoch 3 of 4 (validating every half epoch), its
    result there not yet handed to the driver: Tune retries the pack, each member continues at that
    step from its own newest checkpoint, and every member ends with the losses of an uninterrupted
    run of its config at every validation (trained alone here, within 1e-5), and Optuna holds the
    values the member's records hold."""
    workspace, name = tmp_path / "ws", "killed"
    storage = workspace / "sweeps" / name
    driver = start(
        *run_args(
            workspace,
            name,
            "search={}",
            "start={}",
            "grid.train.lr=[1.0e-2, 3.0e-3]",
            "trials={per_cell: 1}",
            "train.precision=fp32",
            "model.dropout=0.0",
            "train.epochs=4",
            "train.validate_every=0.5",
            "scheduler.type=none",
            "resources.fuse=2",
            "retries=1",
        ),
        log=tmp_path / "driver.log",
    )

    def halfway_into_epoch_three() -> bool:  # the 5th validation: epoch 2.5
        metas = trial_metas(storage)
        return len(metas) == 2 and all(m["epoch"] == 5 for m in metas.values())

    wait_for(lambda: held(driver, halfway_into_epoch_three), 400, "both members halfway into epoch 3", every=0.05)
    descendants = {p: " ".join(p.cmdline()) for p in psutil.Process(driver.pid).children(recursive=True)}
    # The pack's trainable (tune.with_resources over run_pack) is titled by its __name__ between Tune's
    # calls, `ray::run_pack`, and by its class's own name inside one, `ray::ResourceTrainable.train`:
    # with the driver held, its worker may be caught in either.
    workers = [p for p, line in descendants.items() if line.startswith(("ray::run_pack", "ray::ResourceTrainable."))]
    assert workers, f"the pack's worker is a Tune function trainable's actor: {sorted(descendants.values())}"
    for worker in workers:
        os.kill(worker.pid, signal.SIGKILL)
    os.kill(driver.pid, signal.SIGCONT)
    wait_for(lambda: driver.poll() is not None, 600, "the driver to end", explain=lambda: stacks(driver.pid))
    assert driver.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
    log = (tmp_path / "driver.log").read_text()
    for number in (0, 1):
        assert re.search(rf"seqae: trial {number}: continuing at step \d+ of epoch 3$", log, re.M), log[-3000:]
    assert "TBXLoggerCallback" not in log, log[-3000:]  # Tune's loggers take a pack's report as it is
    trials = {t.number: t for t in optuna_trials(workspace, name)}
    assert {n: t.state.name for n, t in trials.items()} == {0: "COMPLETE", 1: "COMPLETE"}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the trial trained (resources.cpu=1): another thread count sums in another order
    try:
        alones = {}
        for number in trials:
            resume, _ = CheckpointStore.of_trial(str(storage), number).resume()
            alones[number] = []
            train(from_flat(resume.config), lambda m, c, n=number: alones[n].append(m.as_dict()), cache_dir=data_cache)
    finally:
        torch.set_num_threads(threads)
    for number, trial in trials.items():
        resume, _ = CheckpointStore.of_trial(str(storage), number).resume()
        alone = alones[number]
        assert len(alone) == 8 and sorted(trial.intermediate_values) == list(range(1, 9))
        for record, kept in zip(alone, resume.history, strict=True):
            # the losses within 1e-5 of the uninterrupted run's: a resume from the wrong state would be
            # far off; an accuracy may differ by a token whose two top logits tie within rounding
            for loss in (M.TRAIN_LOSS, M.VAL_LOSS, M.TEST_LOSS):
                assert kept[loss] == pytest.approx(record[loss], abs=1e-5), (number, record[M.VALIDATION], loss)
            assert kept[M.VAL_TOKEN_ACCURACY] == pytest.approx(record[M.VAL_TOKEN_ACCURACY], abs=5e-4)
            assert trial.intermediate_values[record[M.VALIDATION]] == kept[M.VAL_TOKEN_ACCURACY]  # what the driver got
        assert trial.value == max(r[M.VAL_TOKEN_ACCURACY] for r in resume.history)
