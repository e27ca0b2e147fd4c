"""The registered model as users get it: text in, text out through MLflow's pyfunc, `mlflow models
serve` and `seqae encode`, on a model trained for seconds and registered by the sweep's own code."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import TINY
from tests.sweep_helpers import seqae


@pytest.fixture(scope="module")
def registered(tmp_path_factory, data_cache):
    """A tiny model on a corpus vocabulary (its ids are not the tokenizer's), trained 3 epochs
    into a trial's checkpoint store and registered as 'tiny' by ``Tracker.register``, in a
    workspace's MLflow (SQLite, artifacts in the workspace)."""
    import mlflow

    from seqae_core.checkpoint import CheckpointStore
    from seqae_core.config import from_flat
    from seqae_core.train import train
    from sweeps.stores.tracking import Tracker

    workspace = tmp_path_factory.mktemp("ws")
    config = from_flat({**TINY, "data.vocab": "corpus", "model.latent_len": 12, "train.epochs": 3}, "tiny config")
    storage = str(workspace / "sweeps" / "tiny")
    store = CheckpointStore.of_trial(storage, 0)
    train(config, store.save, cache_dir=data_cache)
    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    tracker = Tracker(uri, "tiny", storage, workspace / "mlartifacts")
    tracker.open("test", None, None, {})
    tracker.child_run(0, config.flat())
    version, new = tracker.register(0, "tiny")
    assert new
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return SimpleNamespace(
        workspace=workspace,
        uri=uri,
        model_uri=f"models:/tiny/{version}",
        config=config,
        store=store,
        model=mlflow.pyfunc.load_model(f"models:/tiny/{version}"),
        tracker=tracker,
        storage=storage,
    )


@pytest.fixture(scope="module")
def texts(registered):
    """A stretch of a page the model trained on (several windows), and a short sentence."""
    from seqae_core.corpus import iter_texts, prefix_at_whitespace

    page = next(iter_texts(registered.config.data))
    return [prefix_at_whitespace(page, 300)[0], "The river rises in the hills to the north."]


def test_the_registered_model_is_text_in_text_out_without_pickle(registered, texts, data_cache, tmp_path):
    import mlflow
    from mlflow.models import Model
    from transformers import AutoTokenizer

    from seqae_core import corpus
    from seqae_core import data as data_lib
    from seqae_core.checkpoint import tensors
    from seqae_core.device import autocast
    from seqae_core.model import ReducingAutoencoder

    folder = Path(mlflow.artifacts.download_artifacts(registered.model_uri, dst_path=str(tmp_path)))
    logged = Model.load(folder)
    assert logged.flavors["python_function"]["loader_module"] == "mlflow.pyfunc.loaders.code_model"
    assert not [p for p in folder.rglob("*") if p.suffix in (".pkl", ".pickle", ".pt", ".pth")]  # nothing unpickled
    assert {p.name for p in (folder / "artifacts").iterdir()} == {
        "model.safetensors",
        "config.json",
        "tokenizer",
        "token_ids.json",
    }
    assert (folder / "artifacts" / "tokenizer" / "tokenizer.json").exists()  # serving needs no Hub
    assert logged.signature.inputs.input_types() == [mlflow.types.DataType.string]
    assert logged.signature.outputs.input_names() == [
        "reconstruction",
        "token_accuracy",
        "tokens",
        "reconstructed_tokens",
        "latents",
    ]
    assert json.loads((folder / logged.saved_input_example_info["artifact_path"]).read_text())
    # The corpus vocabulary: token_ids.json maps each of the model's ids back to BERT's.
    ids = json.loads((folder / "artifacts" / "token_ids.json").read_text())
    splits = data_lib.load(registered.config.data, data_cache)
    assert ids == {"tokenizer": "bert-base-uncased", "token_ids": splits.token_ids.tolist()}
    assert len(ids["token_ids"]) < 30522

    out = registered.model.predict([*texts, ""])
    assert list(out.columns) == logged.signature.outputs.input_names() and len(out) == 3
    tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")
    n, s, d = registered.config.data.input_len, registered.config.latent_len, registered.config.model.d_model
    for text, row in zip(texts, out.itertuples()):
        assert row.tokens == tokenizer.tokenize(text)  # as training tokenizes: no [CLS] or [SEP]
        assert len(row.reconstructed_tokens) == len(row.tokens)
        assert row.token_accuracy == np.mean([a == b for a, b in zip(row.tokens, row.reconstructed_tokens)])
        assert row.latents.shape == (math.ceil(len(row.tokens) / n), s, d) and row.latents.dtype == np.float32
    assert out.latents[0].shape[0] >= 3 and out.token_accuracy[0] >= 0.8, out.token_accuracy[0]  # seen text
    assert out.reconstruction[2] == "" and math.isnan(out.token_accuracy[2]) and out.latents[2].shape == (0, s, d)

    # The latents are the trained encoder's, on windows cut and padded as in training.
    saved = tensors(registered.store.latest("best").files["model.pt"])
    model = ReducingAutoencoder(registered.config, len(splits.token_ids))
    model.load_state_dict(saved["model"])
    model.eval()
    windows = corpus.window_tokens(tokenizer, texts[:1], n)
    rows, _ = corpus.pad_rows(windows, n, tokenizer.pad_token_id)
    with torch.no_grad(), autocast(registered.config, torch.device("cpu")):
        latents = model.encode(torch.from_numpy(np.searchsorted(splits.token_ids, rows)))
    torch.testing.assert_close(torch.from_numpy(out.latents[0]), latents.float())

    # A DataFrame's text column gives the same; a DataFrame whose first column is not it is refused.
    framed = registered.model.predict(pd.DataFrame({"text": texts}))
    pd.testing.assert_frame_equal(framed.drop(columns="latents"), out[:2].drop(columns="latents"))
    with pytest.raises(Exception, match="got column 'id'"):
        registered.model.predict(pd.DataFrame({"id": ["a", "b"], "text": texts}))


@pytest.mark.slow
def test_mlflow_models_serve_answers_text_requests(registered, texts, tmp_path):
    """`mlflow models serve` from a clean process (no PYTHONPATH, elsewhere than the repository, an
    empty hub cache): the model's code_paths hold all of seqae it imports, its artifacts the tokenizer."""
    from cluster.procs import free_port, http_ok, stop_group, wait_until

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HUB_OFFLINE")}
    env["HF_HUB_CACHE"] = str(tmp_path / "empty-hub-cache")  # the tokenizer comes with the model
    env["MLFLOW_TRACKING_URI"] = registered.uri
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # it execs uvicorn from there
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "models",
                "serve",
                "-m",
                registered.model_uri,
                "--env-manager",
                "local",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Meanwhile, a clean process loads the model the same way: every seqae module comes from the model.
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import json, sys, mlflow; mlflow.pyfunc.load_model(sys.argv[1]); print(json.dumps("
                "[m.__file__ for n, m in sys.modules.items() if n.split('.')[0] in ('seqae_core', 'seqae_errors')]))",
                registered.model_uri,
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert probe.returncode == 0, probe.stderr[-3000:]
        files = json.loads(probe.stdout.strip().splitlines()[-1])
        assert len(files) >= 6 and all("/artifacts/code/seqae_" in f for f in files), files

        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: server.poll() is not None or http_ok(f"{url}/ping"), 180, "mlflow models serve", log)
        assert server.poll() is None, log.read_text()[-3000:]
        local = registered.model.predict(texts)
        for body in ({"inputs": texts}, {"dataframe_records": [{"text": t} for t in texts]}):
            request = urllib.request.Request(
                f"{url}/invocations", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                served = json.loads(response.read())["predictions"]
            assert len(served) == 2
            for got, want in zip(served, local.itertuples()):
                assert got["reconstruction"] == want.reconstruction
                assert got["token_accuracy"] == want.token_accuracy
                assert got["tokens"] == want.tokens and got["reconstructed_tokens"] == want.reconstructed_tokens
                np.testing.assert_array_equal(np.asarray(got["latents"], dtype=np.float32), want.latents)
        assert served[0]["token_accuracy"] >= 0.8  # a text the model trained on comes back mostly whole
    finally:
        stop_group(server.pid)


def test_seqae_encode_prints_reconstructions_with_wrong_tokens_marked(registered, texts, capsys, monkeypatch, tmp_path):
    from seqae.cli.main import main
    from seqae_core.checkpoint import marked

    run = seqae("encode", "tiny", *texts, "--workspace", str(registered.workspace))
    assert run.returncode == 0, run.stderr[-3000:]
    local = registered.model.predict(texts)
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"{registered.model_uri}: ")
    for n, row in enumerate(local.itertuples(), 1):
        at = lines.index(
            f"text {n}: token accuracy {row.token_accuracy:.4f} ({len(row.tokens)} tokens, latents "
            f"{' x '.join(map(str, row.latents.shape))})"
        )
        assert lines[at + 2] == "  reconstructed: " + marked(row.tokens, row.reconstructed_tokens)
    marks = [line for line in lines if line.startswith("  reconstructed: ") and "[[" in line]
    assert len(marks) == int((local.token_accuracy < 1.0).sum())  # a text is marked exactly when a token is wrong

    workspace = ["--workspace", str(registered.workspace)]
    assert main(["encode", registered.model_uri, "a text", *workspace]) == 0  # a models:/ URI as well
    assert capsys.readouterr().out.startswith(f"{registered.model_uri}: ")
    for bad, says in (
        ("nope", "no registered model named 'nope'"),
        ("tiny/9", "'tiny' has no version 9"),
        ("tiny/x", "expected NAME, NAME/VERSION or NAME@ALIAS"),
        ("tiny@nope", "'tiny' has no alias 'nope'"),
    ):
        assert main(["encode", bad, "a text", *workspace]) == 2
        assert f"seqae: error: model {bad!r}: {says}" in capsys.readouterr().err
    assert main(["encode", "tiny", "a text", "--workspace", str(registered.workspace / "none")]) == 2
    assert "no sweeps have run in" in capsys.readouterr().err
    assert not (registered.workspace / "none").exists()  # nothing created

    # a text from standard input (-) and one from a file read as the same text given as an argument
    assert main(["encode", "tiny", texts[0], texts[0], *workspace]) == 0
    given = capsys.readouterr().out
    (tmp_path / "page.txt").write_text(texts[0], encoding="utf-8")
    monkeypatch.setattr("sys.stdin", io.StringIO(texts[0]))
    assert main(["encode", "tiny", "-", "--file", str(tmp_path / "page.txt"), *workspace]) == 0
    assert capsys.readouterr().out == given
    for args, says in (
        ([""], "text 1 is empty"),
        ([], "nothing to encode"),
        (["--file", str(tmp_path / "none.txt")], "cannot read it"),
    ):
        assert main(["encode", "tiny", *args, *workspace]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_loading_a_registered_model_runs_no_stored_code(registered, texts, tmp_path):
    """Code planted in a registered model's artifacts, in its stored model file and in every module
    of its stored code paths, each writing a marker file when it runs: `load_registered` (what
    `Sweep.best_model()` and `seqae encode` load with) and `seqae encode` run none of it, leave
    ``sys.path`` as it was, and predict as the installed model does. The same model through
    ``mlflow.pyfunc.load_model``, as `mlflow models serve` loads it, runs the planted code."""
    from urllib.parse import urlparse

    from mlflow.models import Model
    from mlflow.tracking import MlflowClient

    from seqae_errors import ConfigError
    from sweeps.results.registry import load_registered

    version, _ = registered.tracker.register(0, "planted")  # trial 0 again: the weights of 'tiny'
    stored = Path(urlparse(MlflowClient(registered.uri).get_model_version_download_uri("planted", version)).path)
    flavor = Model.load(stored).flavors["python_function"]
    ran = tmp_path / "ran"
    ran.mkdir()
    model_file = Path(flavor["model_code_path"]).name  # the logged file's name: pyfunc runs it from there
    planted = [stored / model_file, *sorted((stored / flavor["code"]).rglob("*.py"))]
    assert len(planted) > 2 and any(p.name == "__init__.py" and p.parent.name == "seqae_core" for p in planted)
    for file in planted:
        marker = ran / "-".join(file.relative_to(stored).parts)
        file.write_text(f"{file.read_text()}\nimport pathlib; pathlib.Path({str(marker)!r}).touch()\n")
    expected = registered.model.predict(texts)

    path = list(sys.path)
    uri, loaded = load_registered(registered.uri, "planted")
    assert uri == f"models:/planted/{version}"
    assert sorted(p.name for p in ran.iterdir()) == [] and sys.path == path
    out = loaded.predict(texts)
    pd.testing.assert_frame_equal(out.drop(columns="latents"), expected.drop(columns="latents"))
    for got, want in zip(out.latents, expected.latents):
        np.testing.assert_array_equal(got, want)
    framed = loaded.predict(pd.DataFrame({"text": texts}))  # a DataFrame's text column, as the pyfunc takes
    pd.testing.assert_frame_equal(framed.drop(columns="latents"), out.drop(columns="latents"))

    run = seqae("encode", "planted", *texts, "--workspace", str(registered.workspace))  # a process of its own
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in ran.iterdir()) == []
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"models:/planted/{version}: ")
    for n, row in enumerate(expected.itertuples(), 1):
        assert (
            f"text {n}: token accuracy {row.token_accuracy:.4f} ({len(row.tokens)} tokens, latents "
            f"{' x '.join(map(str, row.latents.shape))})" in lines
        )

    # The plants are live: pyfunc's loader, in a clean process, runs the stored model file and code paths.
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, mlflow; mlflow.pyfunc.load_model(sys.argv[1])", uri],
        cwd=tmp_path,
        env={**os.environ, "MLFLOW_TRACKING_URI": registered.uri},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    ran_then = {p.name for p in ran.iterdir()}
    assert model_file in ran_then and f"{flavor['code']}-seqae_core-__init__.py" in ran_then, ran_then

    (stored / "artifacts" / "token_ids.json").unlink()  # a version that is not a seqae model: one line
    with pytest.raises(
        ConfigError,
        match=rf"^model 'planted': models:/planted/{version} has no "
        r"artifacts/token_ids.json in the model registry at .*: not a seqae model$",
    ):
        load_registered(registered.uri, "planted")


def test_a_new_version_only_when_the_best_changed_and_the_alias_follows_the_best(
    registered, data_cache, capfd, monkeypatch
):
    """Registering the same best trial again (a resumed sweep whose best did not change) adds no
    version; a new best does, and ``@best`` moves to it, which `seqae encode NAME` loads. Each
    version is linked from its logged model, as MLflow's UI shows it, and registering prints
    nothing into the driver's output, nor leaves the process's MLflow URIs naming the sweep's."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from seqae_core.checkpoint import CheckpointStore
    from seqae_core.train import train
    from sweeps.results.registry import load_registered

    own = "sqlite:////a/python/sessions/own/mlflow.db"  # what the user of seqae.api set before
    monkeypatch.setenv("MLFLOW_TRACKING_URI", own)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)

    tracker, client = registered.tracker, MlflowClient(registered.uri)
    assert tracker.register(0, "champion") == ("1", True)
    assert tracker.register(0, "champion") == ("1", False)
    assert len(client.search_model_versions("name='champion'")) == 1

    config = dataclasses.replace(registered.config, train=dataclasses.replace(registered.config.train, seed=7))
    store = CheckpointStore.of_trial(registered.storage, 1)
    train(config, store.save, cache_dir=data_cache)
    tracker.child_run(1, config.flat())
    assert tracker.register(1, "champion") == ("2", True)
    best = client.get_model_version_by_alias("champion", "best")
    assert (str(best.version), best.run_id) == ("2", tracker.child_run(1))
    assert best.tags["seqae.epoch"] == str(store.latest("best").epoch)
    assert load_registered(registered.uri, "champion")[0] == "models:/champion/2"
    assert load_registered(registered.uri, "champion/1")[0] == "models:/champion/1"
    logged = client.get_run(best.run_id).outputs.model_outputs[-1].model_id
    linked = json.loads(client.get_logged_model(logged).tags["mlflow.modelVersions"])
    assert linked == [{"name": "champion", "version": 2}]
    printed = capfd.readouterr()
    assert "registered model" not in printed.err and "Created version" not in printed.err, printed.err
    assert mlflow.get_tracking_uri() == os.environ["MLFLOW_TRACKING_URI"] == own
    assert mlflow.get_registry_uri() == own and "MLFLOW_REGISTRY_URI" not in os.environ  # it follows tracking's


def test_the_front_is_registered_by_operating_point_and_encode_chooses_by_size(registered, data_cache, capsys):
    """Two objectives, accuracy and latent share: the front's two models become versions tagged with
    their operating points, @best on the more accurate, @latent-50pct and @latent-25pct on each;
    `seqae encode --at` loads the largest share that fits. When the front loses a model, its alias
    goes and its version stays; registering again adds no version. Read back through MLflow's client."""
    import optuna
    from mlflow.tracking import MlflowClient

    from seqae.cli.main import main
    from seqae_core.checkpoint import CheckpointStore
    from seqae_core.train import train
    from sweeps.running.driver import register_front
    from sweeps.spec.sections import Objective

    tracker, client = registered.tracker, MlflowClient(registered.uri)
    config = dataclasses.replace(registered.config, train=dataclasses.replace(registered.config.train, seed=8))
    train(config, CheckpointStore.of_trial(registered.storage, 5).save, cache_dir=data_cache)
    tracker.child_run(5, config.flat())
    objectives = (Objective(metric="val_token_accuracy", mode="max"), Objective(metric="latent_share", mode="min"))

    def trial(number: int, values: list[float]) -> optuna.trial.FrozenTrial:
        frozen = optuna.trial.create_trial(values=values, state=optuna.trial.TrialState.COMPLETE)
        frozen.number = number
        return frozen

    register_front([trial(0, [0.9, 0.5]), trial(5, [0.7, 0.25])], objectives, tracker, "frontier")
    assert (
        "the Pareto front's 2 models are versions of 'frontier', by latent share: @latent-25pct, @latent-50pct"
        in capsys.readouterr().out
    )
    aliases = client.get_registered_model("frontier").aliases
    assert aliases == {"best": 1, "latent-50pct": 1, "latent-25pct": 2}, aliases
    versions = {str(v.version): v for v in client.search_model_versions("name='frontier'")}
    assert {
        n: (v.run_id, v.tags["seqae.objective.latent_share"], v.tags["seqae.objective.val_token_accuracy"])
        for n, v in versions.items()
    } == {"1": (tracker.child_run(0), "0.5", "0.9"), "2": (tracker.child_run(5), "0.25", "0.7")}
    workspace = ["--workspace", str(registered.workspace)]
    for at, version in (("0.3", "2"), ("0.5", "1"), ("1", "1")):
        assert main(["encode", "frontier", "a text", "--at", at, *workspace]) == 0
        assert capsys.readouterr().out.startswith(f"models:/frontier/{version}: ")
    for args, says in (
        (
            ["frontier", "a text", "--at", "0.1"],
            "no model of the front has a latent share at most 0.1 (shares: 0.25, 0.5)",
        ),
        (["frontier@best", "a text", "--at", "0.3"], "--at chooses the version by its latent share"),
        (["tiny", "a text", "--at", "0.3"], "'tiny' has none"),
    ):
        assert main(["encode", *args, *workspace]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err and "Traceback" not in err, err

    register_front([trial(0, [0.9, 0.5])], objectives, tracker, "frontier")  # trial 5 left the front
    assert client.get_registered_model("frontier").aliases == {"best": 1, "latent-50pct": 1}
    assert len(client.search_model_versions("name='frontier'")) == 2
