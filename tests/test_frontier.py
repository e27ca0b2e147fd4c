"""The frontier study's plan and its published table: the cells it trains, and the table it
reads from MLflow runs (a real tracking store; no training)."""

from __future__ import annotations

import math

import pandas as pd
import pyarrow as pa
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from research import frontier as F
from seqae_core import metrics as M
from seqae_core import names as N


def test_fig3_trains_every_cell_from_one_seed_and_the_spread_cells_from_two():
    cells = F.fig3_cells()
    assert len(cells) == len(F.INPUT_LENS) * (len(F.FRACTIONS) + len(F.SPREAD_FRACTIONS))
    assert {(n, f) for n, f, s in cells if s == 1} == {(n, f) for n in F.INPUT_LENS for f in F.FRACTIONS}
    assert {(n, f) for n, f, s in cells if s == 2} == {(n, f) for n in F.INPUT_LENS for f in F.SPREAD_FRACTIONS}


@pytest.mark.parametrize("d_model", [128, 256])
def test_width_cells_reach_each_share_of_the_input_floats(d_model):
    cells = F.width_cells(d_model)
    assert len(cells) == 2 * len(F.WIDTH_INPUT_LENS) * len(F.FLOAT_SHARES)
    for (n, narrow_len, narrow_dim), (m, both_len, both_dim), share in zip(
        cells[::2], cells[1::2], F.FLOAT_SHARES * len(F.WIDTH_INPUT_LENS)
    ):
        assert n == m and narrow_len == n  # narrowing keeps every position
        assert 1 < both_len < n and 1 < both_dim < d_model  # an even split shortens and narrows
        for length, dim in ((narrow_len, narrow_dim), (both_len, both_dim)):
            assert math.isclose(length * dim / (n * d_model), share, rel_tol=0.05), (n, length, dim, share)


def _run(client: MlflowClient, experiment: str, params: dict, val: list[float], test: list[float]) -> None:
    run = client.create_run(experiment, tags={N.OUTCOME: "complete"})
    client.log_batch(
        run.info.run_id,
        params=[Param(k, str(v)) for k, v in params.items()],
        metrics=[
            Metric(key, value, 0, epoch)
            for epoch, (v, t) in enumerate(zip(val, test), 1)
            for key, value in (
                (M.VAL_TOKEN_ACCURACY, v),
                (M.VAL_LOSS, 1 - v),
                (M.TEST_TOKEN_ACCURACY, t),
                (M.TEST_LOSS, 1 - t),
                (M.EPOCH_SECONDS, 10.0 * epoch),
            )
        ],
    )


def test_the_table_has_its_schema_one_row_per_epoch_and_the_kept_epochs_test(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("fig3")
    base = {"data.input_len": 32, "model.d_model": 128, "model.latent_dim": "null", "train.seed": 1}
    for configuration, (half, quarter) in {"recipe": (0.90, 0.70), "tuned": (0.99, 0.95)}.items():
        _run(
            client,
            experiment,
            {**base, "model.latent_len": 16, "model.block": configuration},
            [half - 0.1, half, half - 0.01],
            [half - 0.2, half - 0.02, half - 0.02],
        )
        _run(
            client,
            experiment,
            {**base, "model.latent_len": 8, "model.block": configuration},
            [quarter, quarter - 0.05],
            [quarter - 0.03, quarter - 0.03],
        )
    runs = client.search_runs([experiment])
    rows = []
    for configuration in ("recipe", "tuned"):
        mine = [r for r in runs if r.data.params["model.block"] == configuration]
        rows += F._rows(client, mine, "fig3", configuration, F.WIKI)
    table = F._table(tmp_path, "fig3", rows)

    assert pa.Schema.from_pandas(table, preserve_index=False).names == F.SCHEMA.names
    assert len(table) == 10 and not table.duplicated(["configuration", "latent_len", "seed", "epoch"]).any()
    row = table[(table["configuration"] == "tuned") & (table["latent_len"] == 16) & (table["epoch"] == 3)].iloc[0]
    assert (row["kept_epoch"], row["shape"], row["latent_dim"], row["float_share"], row["cpu_seconds"]) == (
        2,
        "sequence",
        128,
        0.5,
        30.0 * F.CPUS,
    )

    summary = F.fig3_summary(table)
    assert summary[["latent_fraction", "recipe_mean", "tuned_mean"]].round(4).values.tolist() == [
        [0.5, 0.88, 0.97],
        [0.25, 0.67, 0.92],
    ]
    assert summary["dividend"].round(4).tolist() == [0.09, 0.25]
    verdicts = {v.claim: v for v in F.verdicts(table)["tuned"]}
    assert verdicts["C1"].measured == "32: 0.9700" and verdicts["C4"].verdict == F.claims.NOT_TESTED

    again = F._table(tmp_path, "width", [])  # another part's rerun keeps the fig3 rows
    pd.testing.assert_frame_equal(again, table)


def test_publishing_writes_the_table_and_logs_it_in_the_workspace_not_where_it_ran(tmp_path, monkeypatch):
    table = F._table(tmp_path, "offcorpus", [])  # a part that can run first: no figure to draw yet
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    out = tmp_path / "tables"
    out.mkdir()
    (out / "frontier.md").write_text("card")
    F.publish(table, tmp_path, out, tmp_path / "grid.parquet")
    F.publish(table, tmp_path, out, tmp_path / "grid.parquet")  # a later part publishes again, into the same experiment

    assert sorted(p.name for p in out.iterdir()) == ["frontier.csv", "frontier.md", "frontier.parquet"]
    assert (tmp_path / "grid.parquet").exists()  # the grid's rows, for the report
    assert list((tmp_path / "cwd").iterdir()) == []
    client = MlflowClient(f"sqlite:///{tmp_path / 'ws' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("frontier").experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert run.info.artifact_uri.startswith((tmp_path / "ws" / "mlartifacts" / "frontier").as_uri())
        assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == [
            "frontier.csv",
            "frontier.md",
            "frontier.parquet",
        ]


def _cell(
    part: str,
    latent_len: int,
    latent_dim: int,
    val: float,
    test: float,
    cpu: float = 10.0,
    outcome: str = "complete",
    seed: int = 1,
) -> dict:
    """One training of one epoch at 32 tokens, d_model 256, as the table holds it."""
    shape = "both" if latent_len < 32 and latent_dim < 256 else "sequence" if latent_len < 32 else "width"
    return {
        "part": part,
        "configuration": "tuned",
        "shape": shape,
        "input_len": 32,
        "latent_len": latent_len,
        "latent_dim": latent_dim,
        "d_model": 256,
        "float_share": latent_len * latent_dim / (32 * 256),
        "seed": seed,
        "epoch": 1,
        "kept_epoch": 1,
        "trained_on": F.WIKI,
        "scored_on": F.WIKI,
        "val_token_accuracy": val,
        "test_token_accuracy": test,
        "cpu_seconds": cpu,
        "outcome": outcome,
    }


def test_the_sweep_is_judged_share_by_share_on_test_against_the_grid_at_this_machines_speed():
    """Each side's model at a share is its best by validation at that share or below; the sweep
    matches where it trails on test by at most MATCH; its compute is measured against the grid's
    at this machine's speed (the calibration cell took twice the grid's CPU-seconds here)."""
    table = pd.DataFrame(
        [
            _cell("width", 32, 128, 0.99, 0.99),
            _cell("width", 32, 64, 0.98, 0.97),
            _cell("width", 32, 32, 0.90, 0.93),
            _cell("width", 32, 16, 0.80, 0.80),
            _cell("fig3", 12, 256, 0.99, 0.99),  # 0.375: not one of the four shares
            _cell("calibration", 32, 64, 0.98, 0.97, cpu=20.0),
            _cell("sweep", 32, 100, 0.985, 0.975),  # share 0.39: chosen at 0.5, trailing by 1.5 points
            _cell("sweep", 30, 64, 0.97, 0.965),  # share 0.23: chosen at 0.25, within a point
            _cell("sweep", 28, 32, 0.99, 0.50, outcome="pruned"),  # stopped: not on the sweep's front
            _cell("sweep", 32, 30, 0.91, 0.94),  # share 0.117: beats the grid at 0.125
        ]
    )
    summary = F.sweep_summary(table)
    shares, cost = summary.iloc[:4], summary.iloc[4]
    assert shares["float_share"].tolist() == list(F.FLOAT_SHARES)
    assert shares["sweep_latent_dim"].tolist()[:3] == [100, 64, 30] and pd.isna(shares["sweep_latent_dim"].iloc[3])
    assert shares["test_difference"].round(4).tolist()[:3] == [-0.015, -0.005, 0.01]
    assert shares["matches"].tolist() == [False, True, True, False]  # nothing of the sweep's at 0.0625 or below
    assert (cost["speed"], cost["grid_cpu_seconds"], cost["sweep_cpu_seconds"]) == (2.0, 80.0, 40.0)
    assert (cost["cost_ratio"], cost["grid_epochs"], cost["sweep_epochs"], cost["matched"]) == (0.5, 4, 4, 2)
    assert cost["target"] == "missed"  # 2 of 4 shares, at half the grid's compute: SWEEP_TARGET is 3


def test_the_package_ships_the_published_grids_rows_its_report_draws():
    """The report of a two-objective sweep draws the published grid's front beside its own
    (dashboards/report/front.py) from the rows the package ships: the research table's grid
    trainings at their kept epoch, as :func:`F.grid_rows` writes them when the table is published."""
    import pandas as pd

    from dashboards.report.front import GRID_FRONTIER
    from research import TABLES

    shipped = pd.read_parquet(GRID_FRONTIER)
    pd.testing.assert_frame_equal(shipped, F.grid_rows(pd.read_parquet(TABLES / "frontier.parquet")))
    assert set(shipped["part"]) == {"fig3", "width"} and sorted(set(shipped["input_len"])) == [16, 32, 64, 128]
