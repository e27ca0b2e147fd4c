"""The sweep service end to end: real local Ray, MLflow and Optuna on SQLite, real trials."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from seqae_core.metrics import epoch_text
from seqae_core.names import latent_alias
from sweeps.results.export import trial_table
from sweeps.spec import sweep as spec_lib
from sweeps.stores.workspace import Workspace
from tests.conftest import REPO, WIKI_MINI
from tests.sweep_helpers import (
    SMOKE,
    STUDIES,
    metric_steps,
    mlflow_runs,
    optuna_trials,
    run_args,
    seqae,
    sets,
    status,
    tune_results,
    tune_trials,
)

FIG3_FRACTIONS = [1.0, 0.5, 0.25]  # the report's Fig. 3 draws a point per fraction (the paper_fig3 run checks it)
# What each study needs on top of SMOKE to run in seconds: a tiny grid, or few trials.
STUDY_SMOKE = {
    "paper_fig2": ["data.input_len=16", "grid.model.latent_len=[16, 4]"],
    "paper_fig3": ["grid.data.input_len=[16]", f"grid.model.latent_fraction={FIG3_FRACTIONS}"],
    "paper_seeds": ["grid.data.input_len,model.latent_len=[[16, 9]]", "grid.train.seed=[0]"],
    "search_lr_dims": [
        "data.input_len=16",
        "model.latent_len=8",
        "trials.total=3",
        "search.model.layers={type: int, low: 1, high: 2}",
        "scheduler.type=asha",  # and SMOKE's widths, searched: the file's are 8-32x wider
        "search.model.d_model={type: ordered, choices: [16, 32]}",  # as the file's: ordered
        "search.model.d_attn={type: ordered, choices: [16, 32]}",
        "search.model.d_ffn={type: categorical, choices: [32, 64], when: {model.block: transformer}}",
        # the paper's patience (the file's 5) end to end: at a learning rate of ~0 each trial's
        # validation stays where its first epoch put it, so it trains 5 epochs more, of 8
        # (on 3 pages, not 6: those epochs need none of their data's worth)
        "train.epochs=8",
        "train.lr_schedule=constant",
        "train.lr=1.0e-12",
        "data.max_pages=3",
        "search.train.lr={type: loguniform, low: 1.0e-12, high: 1.0e-11}",
        # both widths, and another learning rate, than the transformer's defaults (16, 16, 1e-12)
        "start.paper={model.block: paper, model.d_model: 32, model.d_attn: 32, model.residual: true, "
        "train.lr: 5.0e-12}",
    ],
    "frontier": [
        "data.input_len=16",
        "trials.total=3",
        "search.model.latent_dim={type: categorical, choices: [4, 8, 16]}",
        "constraints=[{metric: latent_share, at_most: 1.0}]",
    ],  # TPE's constraints, met by every latent
    # two of its seven variants, the paper's block and the one with a residual path: each variant's
    # model is tests/test_model.py's, and the file as written loads and plans its 7 x 2 below
    "ablation_paper_block": [
        "data.input_len=16",
        "grid.model.latent_len=[8]",
        "grid.train.lr,model.w_s_init,model.heads,model.norm,model.pos_encoding,model.residual="
        "[[1.0e-3, interpolate, 1, false, learned, false], [1.0e-3, interpolate, 4, true, "
        "sinusoidal, true]]",
    ],
}


def test_every_study_has_a_smoke_setting():
    # the quickstart runs, as the README's offline command, in test_quickstart_tracks_every_trial_in_mlflow_and_optuna
    assert sorted([*STUDY_SMOKE, "quickstart"]) == sorted(p.stem for p in STUDIES.glob("*.yaml"))


def _profiles(study: str) -> list[str]:
    return list(yaml.safe_load((STUDIES / f"{study}.yaml").read_text()).get("profiles") or {})


@pytest.mark.parametrize("study", sorted(p.stem for p in STUDIES.glob("*.yaml")))
def test_every_study_and_each_of_its_profiles_loads_and_plans_its_trials(study):
    path = STUDIES / f"{study}.yaml"
    for profile in [None, *_profiles(study)]:
        spec = spec_lib.load(path, [f"profile={profile}"] if profile else [])
        assert spec.profile == profile and spec.planned_trials() >= 1, (study, profile)


def _runs_here(study: str, profile: str) -> bool:
    """Whether the profile's trials can run on this machine: a GPU profile only where torch sees one."""
    import torch

    return (
        spec_lib.load(STUDIES / f"{study}.yaml", [f"profile={profile}"]).resources.gpu == 0 or torch.cuda.is_available()
    )


# One run per study: a study with a profile runs under its last one that this machine can run (the
# file's own keys, with the profile's overrides, which is how its users run it; `gpu` where there is
# a GPU); the file as written, and every profile, loads above.
SMOKE_RUNS = {
    study: ([p for p in _profiles(study) if _runs_here(study, p)] or [None])[-1] for study in sorted(STUDY_SMOKE)
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "study, profile", [pytest.param(s, p, id=f"{s}-{p or 'as-written'}") for s, p in SMOKE_RUNS.items()]
)
def test_study_runs_in_smoke_mode(study, profile, tmp_path):
    workspace = tmp_path / "ws"
    run = seqae(
        "sweep",
        "run",
        str(STUDIES / f"{study}.yaml"),
        "--workspace",
        str(workspace),
        *(["--profile", profile] if profile else []),
        *sets(*SMOKE, *STUDY_SMOKE[study]),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    info = status(study, workspace)
    assert info["profile"] == profile
    done = sum(info["trials_by_state"].get(s, 0) for s in ("COMPLETE", "PRUNED"))
    assert done == info["trials_total"] >= 2, info
    assert info["best"], info
    if study == "search_lr_dims":
        _check_searched_and_stopped_at_the_papers_patience(workspace, study)
    if study == "paper_fig3":
        _check_fig3_points_are_each_fractions_best_accuracy(workspace, study)
    if study == "frontier":  # the second objective is the latent's floats over the embedded input's (16 x 16)
        shares = [
            (t.values[1], t.params["model.latent_fraction"], t.params["model.latent_dim"])
            for t in optuna_trials(workspace, study)
            if t.values
        ]
        assert shares and all(share == max(1, round(fraction * 16)) * dim / 256 for share, fraction, dim in shares), (
            shares
        )
        table = trial_table(Workspace(workspace), study)  # export's: each trial's latent share and Pareto rank
        best = (
            info["best"] if isinstance(info["best"], list) else [info["best"]]
        )  # status's front: one trial, or several
        assert set(table.trial[table.pareto_rank == 1]) == {b["trial"] for b in best}, table
        assert table.latent_share.notna().all() and table.feasible.all(), table
        # the registry keeps the front: a version per model, an alias per latent share on it, read through MLflow
        client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
        front = table[table.pareto_rank == 1]
        aliases = client.get_registered_model(study).aliases
        by_alias = {
            a: client.get_run(client.get_model_version(study, v).run_id).data.tags["seqae.trial"]
            for a, v in aliases.items()
        }
        assert {a for a in aliases if a.startswith("latent-")} == {latent_alias(x) for x in front.latent_share}, aliases
        assert {int(n) for n in by_alias.values()} <= set(front.trial), (by_alias, front)
        # the report draws the same front on test, beside the published grid's at 16 tokens
        report = workspace / "sweeps" / study / "report"
        drawn = json.loads((report / "front.json").read_text())
        flat = [x for point in sorted(map(tuple, drawn["front"])) for x in point]
        assert flat == pytest.approx(
            [x for point in sorted(zip(front.test_token_accuracy, front.latent_share)) for x in point]
        )
        assert drawn["grid"] and (report / "front.png").exists() and "front.png" in (report / "index.html").read_text()
        assert len(drawn["spent"]) == len(drawn["test"]) == len(table[table.state == "COMPLETE"])


def _check_fig3_points_are_each_fractions_best_accuracy(workspace: Path, study: str) -> None:
    """The report's Fig. 3 draws, per fraction, the best validation accuracy its trial reached, as
    MLflow recorded it. (Whether accuracy falls with the fraction is the paper's claim C2, which the
    claims table checks; it is a result of training, not of the report.)"""
    report = workspace / "sweeps" / study / "report"
    assert (report / "fig3_accuracy_by_fraction.png").exists()
    points = dict(json.loads((report / "fig3_points.json").read_text())["16"])
    client = MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}")
    best = {}
    for child in (r for r in mlflow_runs(workspace, study) if "seqae.trial" in r.data.tags):
        history = client.get_metric_history(child.info.run_id, "val_token_accuracy")
        best[100 * float(child.data.params["model.latent_fraction"])] = max(m.value for m in history)
    assert sorted(best) == [100 * f for f in sorted(FIG3_FRACTIONS)]
    assert points == pytest.approx(best)


def _check_searched_and_stopped_at_the_papers_patience(workspace: Path, study: str) -> None:
    """The search_lr_dims smoke run: learning rate, d_model and d_attn each take more than one value,
    and each trial's values reached Optuna (an ordered width as its position among 16 and 32), Tune
    (the config it trained) and MLflow alike; each trial
    the scheduler left alone trained exactly 5 epochs past its best (the file's patience), the same
    epochs in all three."""
    trials = {t.number: t for t in optuna_trials(workspace, study)}
    runs = {int(r.data.tags["seqae.trial"]): r for r in mlflow_runs(workspace, study) if "seqae.trial" in r.data.tags}
    tune = tune_trials(workspace, study)
    assert set(trials) == set(runs) == set(tune) == {0, 1, 2}, (trials, runs, tune)
    for key, section, field in (
        ("train.lr", "train", "lr"),
        ("model.d_model", "model", "d_model"),
        ("model.d_attn", "model", "d_attn"),
    ):
        sampled = {n: t.params[key] if key == "train.lr" else (16, 32)[t.params[key]] for n, t in trials.items()}
        assert len(set(sampled.values())) >= 2, (key, sampled)  # searched, not pinned
        assert {n: spec.params[key] for n, spec in tune.items()} == sampled, key
        assert {n: getattr(getattr(spec.config, section), field) for n, spec in tune.items()} == sampled, key
        assert {n: type(sampled[n])(r.data.params[key]) for n, r in runs.items()} == sampled, key
    tune_epochs = {
        n: [e for session in sessions for e in session]
        for n, sessions in ((int(name.split("-")[1]), s) for name, s in tune_results(workspace, study).items())
    }
    for number, trial in trials.items():
        epochs, values = zip(*sorted(trial.intermediate_values.items()))
        best = epochs[values.index(max(values))]  # its first epoch: a learning rate of ~0 changes nothing
        if trial.state.name == "PRUNED":  # an ASHA rung stopped it (grace 2, then x3), before its patience ran out
            assert epochs[-1] in (2, 6) and tune[number].start is None, (number, epochs)  # never a starting point
        else:
            assert trial.state.name == "COMPLETE" and epochs == tuple(range(1, best + 6)), (number, best, epochs)
        assert metric_steps(runs[number].info.run_id, "val_token_accuracy", workspace) == list(epochs), number
        assert tune_epochs[number] == list(epochs), number


@pytest.mark.slow
def test_a_sweep_validating_at_quarter_epochs_decides_reports_and_tracks_at_each(tmp_path):
    """train.validate_every=0.25 and ASHA's first rung a quarter into the first epoch (grace 0.25,
    factor 2: rungs at 0.25, 0.5 and 1 of 2 epochs): a progress line at each validation with its
    epochs trained, ASHA stopping trials between epochs' ends, Optuna's intermediate values and
    MLflow's steps numbered by validation, the loss curve's points at their global steps."""
    workspace = tmp_path / "ws"
    run = seqae(
        *run_args(
            workspace,
            "quarters",
            "trials.total=5",
            "train.validate_every=0.25",
            "scheduler.type=asha",
            "scheduler.grace_period=0.25",
            "search.model.d_model={type: categorical, choices: [16, 32]}",
            "search.model.d_attn={type: categorical, choices: [16, 32]}",
            "start.paper_lr={train.lr: 1.0e-3, model.d_model: 32, model.d_attn: 32}",
        )
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # 5 pages of 16 tokens in batches of 64: 5 steps an epoch, validated after steps 2, 3, 4 and 5
    for epoch in ("0.40", "0.60", "0.80", "1", "1.40", "2"):
        assert re.search(rf"^trial 0  epoch {epoch}/2  start paper_lr: ", run.stdout, re.M), run.stdout
    assert re.search(r"^trial \d  stopped by the scheduler after 0\.\d0 epochs$", run.stdout, re.M), run.stdout
    trials = {t.number: t for t in optuna_trials(workspace, "quarters")}
    pruned = [n for n, t in trials.items() if t.state.name == "PRUNED"]
    assert pruned and all(len(trials[n].intermediate_values) < 4 for n in pruned)  # stopped within epoch 1
    for trial in trials.values():
        assert sorted(trial.intermediate_values) == list(range(1, len(trial.intermediate_values) + 1))
        assert trial.state.name == "PRUNED" or len(trial.intermediate_values) == 8  # 4 validations x 2 epochs
    results = {
        name: [json.loads(line) for line in (path / "result.json").read_text().splitlines()]
        for path in (workspace / "sweeps" / "quarters" / "tune").glob("session-*/trial-*")
        for name in [path.name]
    }
    assert [r["epoch"] for r in results["trial-0000"]] == [0.4, 0.6, 0.8, 1, 1.4, 1.6, 1.8, 2]
    header = re.search(r"^trial\s+state\s+epochs\s", run.stdout, re.M)  # the end's table: epochs trained, not results
    assert header, run.stdout
    table = run.stdout[header.start() :].splitlines()
    rows = {
        int(m[1]): (m[2], m[3]) for line in table[1:] if (m := re.match(r"(\d+)(?: \(\w+\))?\s+(\w+)\s+(\S+)", line))
    }
    assert rows[0] == ("COMPLETE", "2"), table
    stopped_at = {int(name.split("-")[1]): epoch_text(lines[-1]["epoch"]) for name, lines in results.items()}
    assert all(rows[n] == ("PRUNED", stopped_at[n]) for n in pruned), table
    for child in [r for r in mlflow_runs(workspace, "quarters") if "seqae.trial" in r.data.tags]:
        number = int(child.data.tags["seqae.trial"])
        assert metric_steps(child.info.run_id, "val_token_accuracy", workspace) == sorted(
            trials[number].intermediate_values
        )
        last_step = int(child.data.metrics["global_step"])
        assert metric_steps(child.info.run_id, "train_loss_steps", workspace) == list(range(3, last_step + 1, 3))


@pytest.mark.slow
def test_quickstart_tracks_every_trial_in_mlflow_and_optuna(tmp_path):
    workspace = tmp_path / "ws"
    n = 3
    run = seqae(
        "sweep",
        "run",
        str(STUDIES / "quickstart.yaml"),
        "--workspace",
        str(workspace),
        *sets(
            *SMOKE,
            "data.input_len=16",
            "model.latent_len=8",
            f"trials.total={n}",
            "train.log_every_steps=3",
            "checkpoints.keep_best=1",
            # relative, as the README writes it: trials run in Ray's working directory, not here
            f"data.path={os.path.relpath(WIKI_MINI, REPO)}",
        ),
        fresh=True,
    )  # a new process, as a user's: everything it prints is asserted on below
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # Progress a person can read: a line per trial result, a table at the end, no Tune boxes.
    lines = run.stdout.splitlines()
    for number in range(n):
        assert any(
            re.match(
                rf"trial {number}  epoch 2/2  (start paper_lr: )?lr=\d\.\de-0\d  val_token_accuracy 0\.\d{{4}}  "
                r"best 0\.\d{4} \(trial \d\)  \d+:\d\d elapsed  ~\d+:\d\d left$",
                line,
            )
            for line in lines
        ), run.stdout
    header = lines.index(next(line for line in lines if re.match(r"trial +state", line)))
    assert [re.match(r"\d+(?: \(\w+\))? +(\w+)", line).group(1) for line in lines[header + 1 : header + 1 + n]] == [
        "COMPLETE"
    ] * n
    assert "Configuration for experiment" not in run.stdout and "TensorBoard" not in run.stdout
    # nothing a user did not ask for: no traceback, no warning of Ray's, Tune's, MLflow's or matplotlib's
    assert not re.search(r"Traceback|WARNING|Warning|fontManager", run.stdout + run.stderr), run.stderr[-3000:]
    assert re.search(
        r"^trial 0  epoch 1/2  start paper_lr: lr=1\.0e-03  ", run.stdout, re.M
    )  # the file's starting point first
    assert re.search(
        r"^seqae: best: trial \d  val_token_accuracy 0\.\d{4} \(validation, selected on\)  "
        r"test_token_accuracy 0\.\d{4} \(test pages, never selected on\)$",
        run.stdout,
        re.M,
    )
    # the file's starting point, then random search
    assert re.search(r"^seqae: trials proposed by: start 1, random 2$", run.stdout, re.M), run.stdout

    runs = mlflow_runs(workspace, "quickstart")
    parents = [r for r in runs if r.data.tags.get("seqae.role") == "sweep"]
    children = [r for r in runs if "seqae.trial" in r.data.tags]
    assert len(parents) == 1 and len(children) == n
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(int(r.data.tags["seqae.trial"]) for r in children) == list(range(n))
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("quickstart")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # model training, not GenAI
    assert experiment.tags["mlflow.experiment.primaryMetric.name"] == "val_token_accuracy"
    for child in children:
        tags, params = child.data.tags, child.data.params
        assert tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert tags["optuna.trial_number"] == tags["seqae.trial"]
        assert tags["ray.tune_trial_id"] and tags["ray.node_id"]
        assert params["model.d_model"] == "16" and params["data.input_len"] == "16" and "train.lr" in params
        assert params["data.path"] == str(WIKI_MINI.resolve())
        assert metric_steps(child.info.run_id, "val_token_accuracy", workspace) == [1, 2]
        # the loss curve: a point every 3 steps, at its global step; the machine's use once per epoch
        last_step = int(child.data.metrics["global_step"])
        assert metric_steps(child.info.run_id, "train_loss_steps", workspace) == list(range(3, last_step + 1, 3))
        for name in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"):
            assert metric_steps(child.info.run_id, name, workspace) == [1, 2]
        assert 0 < child.data.metrics["system/system_memory_usage_percentage"] < 100
        (dataset,) = [i.dataset for i in child.inputs.dataset_inputs]
        assert json.loads(dataset.source)["path"] == str(WIKI_MINI.resolve()) and dataset.source_type == "hugging_face"
        assert json.loads(dataset.profile)["config"]["input_len"] == 16
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"config.yaml", "samples.txt", "best_metrics.json"} <= artifacts
        assert "checkpoint" not in artifacts  # a model per trial is not MLflow's to keep: the registry has the best
        samples = client.download_artifacts(child.info.run_id, "samples.txt", str(tmp_path))
        assert "original:" in open(samples).read()

    assert len({c.inputs.dataset_inputs[0].dataset.digest for c in children}) == 1  # one data, one digest
    trials = optuna_trials(workspace, "quickstart")
    assert [t.state.name for t in trials] == ["COMPLETE"] * n
    assert [sorted(t.intermediate_values) for t in trials] == [[1, 2]] * n  # the last epoch's value too
    assert len({t.params["train.lr"] for t in trials}) == n  # the search sampled, not repeated

    info = status("quickstart", workspace)
    assert info["trials_total"] == n and info["trials_by_state"] == {"COMPLETE": n}
    assert info["mlflow_parent_run_id"] == parents[0].info.run_id
    # the sweep run charts its progress: the best so far, and its test score, against trials ended
    best = {
        m: [
            p.value
            for p in sorted(client.get_metric_history(parents[0].info.run_id, f"best/{m}"), key=lambda p: p.step)
        ]
        for m in ("val_token_accuracy", "test_token_accuracy")
    }
    assert metric_steps(parents[0].info.run_id, "best/val_token_accuracy", workspace) == list(range(1, n + 1))
    assert best["val_token_accuracy"] == sorted(best["val_token_accuracy"])  # never worse
    assert best["val_token_accuracy"][-1] == info["best"]["values"]["val_token_accuracy"]
    assert best["test_token_accuracy"][-1] == info["best"]["test"]["test_token_accuracy"]
    assert info["optuna_study_name"] == "quickstart" and info["optuna_storage"].startswith("sqlite:///")
    assert info["best"]["values"]["val_token_accuracy"] == max(t.value for t in trials)
    # Disk: only the best trial keeps its model and optimizer state; the others keep what status reads.
    assert re.search(
        rf"^seqae: checkpoints kept for the best trial \(checkpoints.keep_best=1\); released for "
        rf"{n - 1} ended trials, \d+\.\d MB freed$",
        run.stdout,
        re.M,
    ), run.stdout[-2000:]
    for trial in trials:
        store = Path(info["storage"]) / "trials" / f"{trial.number:04d}"
        kept = trial.number == info["best"]["trial"]
        assert {p.name for p in store.rglob("*.pt")} == ({"state.pt", "model.pt"} if kept else set()), trial.number
        assert kept or sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) < 100_000
    versions = client.search_model_versions("name='quickstart'")
    assert len(versions) == 1 and versions[0].run_id == next(
        c.info.run_id for c in children if int(c.data.tags["seqae.trial"]) == info["best"]["trial"]
    )
    # The registered model is text in, text out; on the quickstart's corpus vocabulary its
    # token_ids.json maps the model's ids back to BERT's.
    import mlflow
    from transformers import AutoTokenizer

    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    folder = mlflow.artifacts.download_artifacts(f"models:/quickstart/{versions[0].version}", dst_path=str(tmp_path))
    ids = json.loads(next(Path(folder).rglob("token_ids.json")).read_text())
    assert ids["tokenizer"] == "bert-base-uncased" and len(ids["token_ids"]) < 30522
    tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")
    assert tokenizer.convert_ids_to_tokens(ids["token_ids"][:1]) == ["[PAD]"]
    out = mlflow.pyfunc.load_model(f"models:/quickstart/{versions[0].version}").predict(["a short text"])
    assert out.tokens[0] == ["a", "short", "text"] and out.latents[0].shape == (1, 8, 16)  # 16 -> 8 tokens, d_model 16


def test_runs_a_killed_driver_left_without_parameters_are_adopted_and_completed(tmp_path):
    """Creating a run and logging its parameters are two MLflow calls. A driver killed between them
    left a sweep's or a trial's run without parameters (the chaos soak met one, and the report then
    divided by zero). The next driver adopts such a run, logs what it lacks, and makes no second one."""
    from mlflow.tracking import MlflowClient

    from sweeps.stores.tracking import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("s", tags={"seqae.fingerprint": "f", "seqae.sweep": "s"})
    # what the killed driver left: its sweep run, unrecorded in the sweep's state, and trial 0's run, both bare
    parent = client.create_run(experiment, run_name="s", tags={"seqae.sweep": "s", "seqae.role": "sweep"})
    client.create_run(
        experiment,
        run_name="trial-0000",
        tags={"mlflow.parentRunId": parent.info.run_id, "seqae.sweep": "s", "seqae.trial": "0"},
    )
    tracker = Tracker(uri, "s", str(tmp_path / "storage"))
    tracker.open("f", None, None, {"sampler": "tpe"})
    tracker.trial_started(0, {"train.lr": 0.01, "train.seed": 0}, "tune-0", False)
    tracker.trial_started(1, {"train.lr": 0.02, "train.seed": 0}, "tune-1", False)

    assert tracker.parent_run_id == parent.info.run_id
    assert len(client.search_runs([experiment])) == 3
    assert client.get_run(parent.info.run_id).data.params == {"sampler": "tpe"}
    assert client.get_run(tracker.child_run(0)).data.params == {"train.lr": "0.01", "train.seed": "0"}
    assert client.get_run(tracker.child_run(1)).data.params == {"train.lr": "0.02", "train.seed": "0"}


def test_a_run_records_its_dataset_once_and_other_data_has_another_digest(tmp_path, data_cache):
    """Each trial's run records the prepared entry it trains on through MLflow's dataset API: its
    source, the data config and each split's size; a digest that differs with the data (another
    input length, another split) and not otherwise; and one input however often the run is reopened
    (a resume, a restarted driver). An experiment an older seqae made gains the model-training mark."""
    from mlflow.tracking import MlflowClient

    from seqae_core import data
    from seqae_core.config import from_flat
    from sweeps.stores.tracking import Tracker
    from tests.conftest import TINY

    configs = {
        0: from_flat(TINY).data,
        1: from_flat({**TINY, "data.input_len": 8}).data,
        2: from_flat({**TINY, "data.split_seed": 1}).data,
        3: from_flat(TINY).data,
    }
    entries = {data.shared_settings(c): data.prepare(c, data_cache) for c in configs.values()}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    client.create_experiment("older", tags={"seqae.fingerprint": "f", "seqae.sweep": "older"})
    tracker = Tracker(uri, "older", str(tmp_path / "storage"), entries=entries)
    tracker.open("f", None, None, {})
    for number, config in configs.items():
        tracker.trial_started(number, {"trial": number}, f"tune-{number}", False, config)
    tracker.trial_started(0, {"trial": 0}, "tune-0", True, configs[0])  # continued in the same session
    restarted = Tracker(uri, "older", str(tmp_path / "storage"), entries=entries)
    restarted.open("f", tracker.experiment_id, tracker.parent_run_id, {})
    restarted.trial_started(0, {"trial": 0}, "tune-5", True, configs[0])  # reattached by a new driver

    assert client.get_experiment_by_name("older").tags["mlflow.experimentKind"] == "custom_model_development"
    inputs = {n: client.get_run(tracker.child_run(n)).inputs.dataset_inputs for n in configs}
    assert [len(i) for i in inputs.values()] == [1, 1, 1, 1]
    digests = {n: i[0].dataset.digest for n, i in inputs.items()}
    assert digests[0] == digests[3] and len({digests[0], digests[1], digests[2]}) == 3, digests
    dataset = inputs[0][0].dataset
    splits = data.load(configs[0], data_cache)
    profile = json.loads(dataset.profile)
    assert profile["samples"] == {"train": len(splits.train), "val": len(splits.val), "test": len(splits.test)}
    assert profile["config"] == {**profile["config"], "input_len": 16, "samples": "windows", "max_pages": 6}
    assert (
        json.loads(dataset.source)["path"] == str(WIKI_MINI)
        and json.loads(dataset.source)["config_name"] == "20231101.en"
    )
    assert {(t.key, t.value) for t in inputs[0][0].tags} == {("mlflow.data.context", "training")}
