"""A new user's first minutes: the README's commands offline, bad data sources and read-only
commands. Whatever fails, fails before anything is created, so the next command just works."""

from __future__ import annotations

import os

import pytest

from tests.conftest import REPO, WIKI_MINI
from tests.sweep_helpers import SMOKE, STUDIES, seqae, sets

QUICKSTART = str(STUDIES / "quickstart.yaml")
# the README's offline command, with the path as it writes it (relative to the repository)
OFFLINE = f"data.path={os.path.relpath(WIKI_MINI, REPO)}"
TINY = [s for s in SMOKE if not s.startswith("data.path=")] + [
    "data.input_len=16",
    "model.latent_len=8",
    "trials.total=2",
]


def test_readme_first_command_offline_is_refused_with_the_offline_command(tmp_path):
    """`seqae sweep run sweeps/studies/quickstart.yaml` with no Hub (HF_HUB_OFFLINE=1 in conftest):
    one line naming the data source and the offline command. That command, with the path as the
    README writes it, runs in test_sweeps.py::test_quickstart_tracks_every_trial_in_mlflow_and_optuna."""
    workspace = tmp_path / "seqae-runs"
    first = seqae("sweep", "run", QUICKSTART, "--workspace", str(workspace), env={"HF_HUB_OFFLINE": "1"})
    assert first.returncode == 2, first.stdout[-2000:] + first.stderr[-2000:]
    message = first.stderr.strip().splitlines()[-1]
    assert "data.path='wikimedia/wikipedia'" in message and "Offline?" in message and "data.path=" in message
    assert "Traceback" not in first.stderr
    assert not workspace.exists()


def test_an_unreachable_hub_is_said_at_once_and_creates_nothing(tmp_path):
    """Online-style (HF_HUB_OFFLINE unset) on a machine that cannot reach the Hub, with nothing in
    its hub cache: the Hub is named unreachable, without the Hub client's minute of retries."""
    from cluster.procs import free_port

    workspace = tmp_path / "seqae-runs"
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    run = seqae(
        "sweep",
        "run",
        QUICKSTART,
        "--workspace",
        str(workspace),
        env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "empty-cache")},
    )
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    message = run.stderr.strip().splitlines()[-1]
    assert f"the Hugging Face Hub ({endpoint}) is unreachable" in message and "Offline?" in message, message
    assert "Retrying" not in run.stderr and "Traceback" not in run.stderr
    assert not workspace.exists()


@pytest.mark.parametrize(
    "bad, named",
    [
        pytest.param(
            "data.path=../shared/data/no-such-folder",
            "data.path='../shared/data/no-such-folder' does not exist",
            id="missing-folder",
        ),
        pytest.param("data.text_column=body", "data.text_column='body' is not a column", id="no-text-column"),
        pytest.param(
            "data.tokenizer=no-such/tokenizer",
            "data.tokenizer='no-such/tokenizer' cannot be loaded",
            id="unknown-tokenizer",
        ),
    ],
)
def test_a_data_source_that_does_not_load_is_named_and_creates_nothing(tmp_path, bad, named):
    workspace = tmp_path / "seqae-runs"
    run = seqae("sweep", "run", QUICKSTART, "--workspace", str(workspace), *sets(OFFLINE, *TINY, bad))
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert named in run.stderr and "Traceback" not in run.stderr
    assert not workspace.exists()


UNKNOWN = "seqae: error: no sweep named 'nosuch'"


@pytest.mark.parametrize(
    "command, code, says",
    [
        pytest.param(["sweep", "status", "nosuch"], 2, UNKNOWN, id="status"),
        pytest.param(["sweep", "status", "nosuch", "--json"], 2, UNKNOWN, id="status-json"),
        pytest.param(["sweep", "list"], 0, "no sweeps in this workspace", id="list"),
        pytest.param(["report", "nosuch"], 2, UNKNOWN, id="report"),
        pytest.param(["sweep", "resume", "nosuch"], 2, UNKNOWN, id="resume"),
    ],
)
def test_read_only_and_unknown_sweep_commands_create_nothing(tmp_path, command, code, says):
    workspace = tmp_path / "seqae-runs"
    run = seqae(*command, "--workspace", str(workspace))
    assert run.returncode == code and says in run.stdout + run.stderr, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert not workspace.exists()
