"""seqae from Python (`seqae.Sweep`): the docs page's code runs as written, on tiny sizes,
and a mistake is an exception naming the key or value, with nothing created."""

from __future__ import annotations

import pytest

from seqae import Sweep
from seqae_errors import ConfigError
from tests.conftest import REPO
from tests.sweep_helpers import PYTHON_PAGE, TINY, python_page


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQAE_WORKSPACE", str(tmp_path / "ws"))
    monkeypatch.chdir(REPO)
    return tmp_path / "ws"


@pytest.mark.slow
def test_the_python_page_runs_as_written(workspace, capsys):
    page: dict[str, object] = {}
    exec(
        compile(python_page(False, [*TINY, "trials.total=3"]), str(PYTHON_PAGE), "exec"), page
    )  # the page's own code, as a user runs it
    sweep = page["sweep"]
    assert isinstance(sweep, Sweep) and sweep.exit_code == 0 and sweep.workspace.root == workspace.resolve()
    assert page["info"].trials_by_state == {"COMPLETE": 3}
    assert sweep.status().trials_by_state == {"COMPLETE": 4}  # and the one extend added
    best = page["best"]
    assert set(best.values) == {"val_token_accuracy"} and 0 < best.test["test_token_accuracy"] <= 1
    assert [t.number for t in page["trials"]] == [0, 1, 2] and page["trials"][0].kept_epoch >= 1
    table = page["table"]
    assert len(table) == 3 and table["state"].tolist() == ["COMPLETE"] * 3
    assert table.loc[table.trial == best.number, "val_token_accuracy"].item() == best.values["val_token_accuracy"]
    assert 0 <= page["out"].token_accuracy[0] <= 1 and page["out"].latents[0].ndim == 3
    assert page["page"].name == "index.html" and page["page"].exists()
    out = capsys.readouterr().out
    assert "no sweep named 'no-such-sweep'" in out
    assert "seqae: sweep quickstart: complete" in out and "trial 0  epoch 1/" in out  # show_progress() asked


def test_a_mistake_is_an_exception_naming_it_and_nothing_is_created(tmp_path):
    workspace = tmp_path / "ws"
    with pytest.raises(ConfigError, match="no sweep named 'missing'"):
        Sweep.open("missing", workspace)
    with pytest.raises(ConfigError, match="unknown key 'ata'"):
        Sweep.create(REPO / "sweeps" / "studies" / "quickstart.yaml", set=["ata.input_len=8"], workspace=workspace)
    with pytest.raises(ConfigError, match="backends: unknown key 'mlflow'"):
        Sweep.create(REPO / "sweeps" / "studies" / "quickstart.yaml", workspace=workspace, backends={"mlflow": "x"})
    assert not workspace.exists()
