"""The report and `seqae ui`, checked in real headless Chromium (Debian's chromium and chromedriver).

The MLflow UI is found by structure (ag-grid's row and column ids, data-testid attributes) and by
the sweep's own names and values; what MLflow's UI calls things is kept in ``MLFLOW_UI``."""

from __future__ import annotations

import json
import re
import signal
import socket

import pytest

from seqae_core.checkpoint import CheckpointStore
from tests.conftest import SCREENSHOTS
from tests.sweep_helpers import SMOKE, STUDIES, kill_group, seqae, sets, start, start_ui, stop_ui, wait_for

pytestmark = pytest.mark.slow

EPOCHS = 3  # each trial of the finished sweep
# MLflow 3.17's UI: the ids of the parts the tests read, in one place
MLFLOW_UI = {
    "row": '.ag-row[row-id="{run_id}"]',  # a runs-table row, by run id
    "run name": '[col-id="attributes.`Run Name`"]',  # its cell, holding the expand button of a parent
    "dataset": '[col-id="attributes.`Dataset`"]',
    "chart card": '[data-testid="experiment-view-compare-runs-card"]',  # a run's metric chart
    "chart title": '[title="{metric}"]',
    "assistant close": 'button[data-component-id="mlflow.assistant.chat_panel.close"]',
    "model training": "workflowType=machine_learning",  # the UI's mode for a page, as dashboards.ui.runs_url sets it
}


def browser():
    from dashboards.browser import headless_chromium

    try:
        return headless_chromium()
    except RuntimeError as missing:
        pytest.fail(str(missing))


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    workspace = tmp_path_factory.mktemp("dash") / "ws"
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
            "trials.total=3",
            f"train.epochs={EPOCHS}",
            "train.log_every_steps=2",
        ),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "seqae: report:" in run.stdout  # rebuilt at the end of the sweep
    return workspace


def save(driver, folder, name: str) -> None:
    path = folder / name
    driver.save_screenshot(str(path))
    SCREENSHOTS.append(str(path))


def test_report_renders_every_figure_without_console_errors(finished_sweep, screenshot_dir):
    index = finished_sweep / "sweeps" / "quickstart" / "report" / "index.html"
    # the story first: what it found, on validation and on test, against its starting point, and at what cost
    story = re.sub(r"<[^>]+>", " ", index.read_text().split('<div id="story">')[1].split("</div>")[0])
    assert re.search(
        r"The best trial is \d \(proposed by [a-z -]+\): val_token_accuracy 0\.\d{4} \(validation, "
        r"selected on\); test_token_accuracy 0\.\d{4} \(test pages, never selected on\)\.",
        story,
    ), story
    assert re.search(r"Starting point paper_lr: trial 0, val_token_accuracy 0\.\d{4}", story), story
    # the file's starting point, then random search
    assert re.search(r"Trials proposed by: start 1, random 2.*Spent 0\.\d{4} cpu-hours\.", story), story
    assert '<table id="claims">' not in index.read_text()  # a search tests none of the paper's claims: one line says so
    pngs = sorted(p.name for p in index.parent.glob("*.png"))
    assert {"losses.png", "optuna_history.png", "optuna_parallel.png"} <= set(pngs)
    assert "optuna_importances.png" not in pngs  # 3 trials: too few to rank parameters, and the report says so
    assert "Optuna parameter importances: needs 5 completed trials, the study has 3" in index.read_text()
    driver = browser()
    try:
        driver.get(index.as_uri())
        wait_for(lambda: driver.execute_script("return document.readyState") == "complete", 30, "the report")
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])"
        )
        assert len(images) == len(pngs) and all(ok for _, ok in images), images
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []

        # the trials table sorts by a clicked column
        def rows() -> list[str]:
            cells = "return Array.from(document.querySelectorAll('#trials tbody tr')).map(r => r.innerText)"
            return [r.split()[0] for r in driver.execute_script(cells)]

        assert rows() == ["0", "1", "2"]
        driver.execute_script("document.querySelector('#trials th').click()")
        driver.execute_script("document.querySelector('#trials th').click()")
        assert rows() == ["2", "1", "0"]
        assert driver.execute_script("return document.querySelectorAll('.wrong').length") > 0  # highlighted tokens
        save(driver, screenshot_dir, "report.png")
    finally:
        driver.quit()
    # and the report is an artifact of the sweep's parent run
    from mlflow.tracking import MlflowClient

    info = json.loads(seqae("sweep", "status", "quickstart", "--json", "--workspace", str(finished_sweep)).stdout)
    client = MlflowClient(f"sqlite:///{finished_sweep / 'mlflow.db'}")
    logged = {a.path for a in client.list_artifacts(info["mlflow_parent_run_id"], "report")}
    assert "report/index.html" in logged and "report/losses.png" in logged


def test_the_loss_curve_is_drawn_against_epochs_with_whole_epoch_ticks(tmp_path):
    """The points of a trial's loss curve, logged at global steps, sit at fractional epochs between
    the steps each epoch ended at; every epoch axis is ticked at whole epochs only."""
    import matplotlib.pyplot as plt

    from dashboards.report import figures
    from dashboards.report.data import Trial
    from seqae_core import metrics as M

    trial = Trial(
        0,
        "run",
        "FINISHED",
        "complete",
        {},
        curves={
            M.TRAIN_LOSS: [(1, 3.0), (2, 2.0)],
            M.VAL_LOSS: [(1, 2.9), (2, 2.1)],
            M.GLOBAL_STEP: [(1, 10), (2, 20)],
            M.TRAIN_LOSS_STEPS: [(5, 4.0), (10, 3.0), (15, 2.5), (20, 2.0)],
        },
    )
    assert figures.step_curve(trial) == [(0.5, 4.0), (1.0, 3.0), (1.5, 2.5), (2.0, 2.0)]
    assert (
        figures.step_curve(Trial(1, "run", "FINISHED", "complete", {}, curves=trial.curves | {M.TRAIN_LOSS_STEPS: []}))
        == []
    )  # then the report draws the epochs' means
    fig, ax = plt.subplots()
    ax.plot([0.5, 1.0, 1.5, 2.0], [4.0, 3.0, 2.5, 2.0])
    figures.epoch_axis(ax)
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    plt.close(fig)
    assert ticks and all(t == int(t) for t in ticks), ticks
    assert figures.losses([trial], tmp_path) == tmp_path / "losses.png"


def test_seqae_ui_serves_mlflow_and_optuna_and_stops_on_ctrl_c(finished_sweep, screenshot_dir, tmp_path):
    """The experiment's link that `seqae ui` prints opens on its runs (not MLflow's GenAI overview);
    the trials show under the sweep's run with their dataset, and a trial's page its metrics, with
    one point per epoch in its accuracy chart."""
    from mlflow.tracking import MlflowClient
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    ui, mlflow_port, optuna_port = start_ui(finished_sweep, tmp_path / "ui.log")
    try:
        log = (tmp_path / "ui.log").read_text()
        assert f"http://127.0.0.1:{mlflow_port}" in log and f"http://127.0.0.1:{optuna_port}" in log
        info = json.loads(seqae("sweep", "status", "quickstart", "--json", "--workspace", str(finished_sweep)).stdout)
        experiment = info["mlflow_experiment_id"]
        link = re.search(r"sweep quickstart: (\S+)", log).group(1)
        client = MlflowClient(f"sqlite:///{finished_sweep / 'mlflow.db'}")
        kids = {r.data.tags["seqae.trial"]: r for r in client.search_runs([experiment]) if "seqae.trial" in r.data.tags}
        assert len(kids) == 3
        driver = browser()
        wait = WebDriverWait(driver, 60)
        css = driver.find_elements
        try:
            driver.get(f"http://127.0.0.1:{mlflow_port}/#/experiments")
            wait.until(lambda d: "quickstart" in d.find_element(By.TAG_NAME, "body").text)
            for close in css(By.CSS_SELECTOR, MLFLOW_UI["assistant close"]):  # MLflow's chat panel, open at first
                close.click()
            save(driver, screenshot_dir, "mlflow-experiments.png")

            driver.get(link)

            def row(run_id: str) -> str:
                return MLFLOW_UI["row"].format(run_id=run_id)

            wait.until(lambda d: css(By.CSS_SELECTOR, row(info["mlflow_parent_run_id"])))
            assert re.search(rf"#/experiments/{experiment}/runs\?", driver.current_url), driver.current_url
            parent = css(By.CSS_SELECTOR, f"{row(info['mlflow_parent_run_id'])} {MLFLOW_UI['run name']} button")
            parent[0].click()  # expand the nested child runs
            for kid in kids.values():  # each trial's row, its dataset named with the digest of its data
                named = "{0.name} ({0.digest})".format(kid.inputs.dataset_inputs[0].dataset)
                cells = f"{row(kid.info.run_id)} {MLFLOW_UI['dataset']}"
                wait.until(
                    lambda d, named=named, cells=cells: any(named in c.text for c in css(By.CSS_SELECTOR, cells))
                )
            save(driver, screenshot_dir, "mlflow-runs.png")

            kid = kids["0"]
            dataset = kid.inputs.dataset_inputs[0].dataset
            page = f"http://127.0.0.1:{mlflow_port}/#/experiments/{experiment}/runs/{kid.info.run_id}"
            driver.get(f"{page}?{MLFLOW_UI['model training']}")
            body = lambda: driver.find_element(By.TAG_NAME, "body").text  # noqa: E731
            wait.until(
                lambda d: all(
                    m in body() for m in ("val_token_accuracy", "train_loss_steps", "system/cpu_utilization_percentage")
                )
            )
            assert f"{dataset.name} ({dataset.digest})" in body()
            save(driver, screenshot_dir, "mlflow-trial.png")

            driver.get(f"{page}/model-metrics?{MLFLOW_UI['model training']}")
            card = f"{MLFLOW_UI['chart card']}:has({MLFLOW_UI['chart title'].format(metric='val_token_accuracy')})"

            def accuracy_chart(d):  # the chart cards render as they scroll into view
                found = css(By.CSS_SELECTOR, card)
                if not found and css(By.CSS_SELECTOR, MLFLOW_UI["chart card"]):
                    d.execute_script("arguments[0].scrollIntoView()", css(By.CSS_SELECTOR, MLFLOW_UI["chart card"])[-1])
                return found and d.execute_script(
                    "const plot = arguments[0].querySelector('.js-plotly-plot');"
                    "return plot && plot.data && plot.data.map(trace => trace.x)",
                    found[0],
                )

            traces = wait.until(accuracy_chart)
            assert traces and all(list(x) == list(range(1, EPOCHS + 1)) for x in traces), traces  # a point per epoch
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", css(By.CSS_SELECTOR, card)[0])
            save(driver, screenshot_dir, "mlflow-trial-accuracy.png")

            driver.get(f"http://127.0.0.1:{optuna_port}/dashboard")
            wait_for(lambda: "quickstart" in driver.find_element(By.TAG_NAME, "body").text, 60, "optuna-dashboard")
            save(driver, screenshot_dir, "optuna-dashboard.png")
        finally:
            driver.quit()
    finally:
        stop_ui(ui, signal.SIGINT, tmp_path / "ui.log", (mlflow_port, optuna_port))  # Ctrl-C


def test_report_shows_failed_and_running_trials(tmp_path):
    workspace, name = tmp_path / "ws", "mixed"
    # lr 1e30 makes the first trial's loss NaN at once; the second trains until the test stops it
    sweep = start(
        "sweep",
        "run",
        str(STUDIES / "paper_fig3.yaml"),
        "--name",
        name,
        "--workspace",
        str(workspace),
        *sets(
            *SMOKE,
            "grid.data.input_len=[16]",
            "grid.model.latent_fraction=[0.5]",
            "grid.train.lr=[1e30, 0.001]",
            "train.lr_schedule=constant",
            "model.block=transformer",
            "train.epochs=1000",
            "train.patience=1000",
            "max_concurrent=1",
        ),
        log=tmp_path / "sweep.log",
    )
    try:
        storage = str(workspace / "sweeps" / name)
        wait_for(
            lambda: any(CheckpointStore.of_trial(storage, n).records() for n in CheckpointStore.trials(storage)),
            300,
            "the second trial to train",
        )
        built = seqae("report", name, "--workspace", str(workspace))
        assert built.returncode == 0, built.stderr[-3000:]
        page = (workspace / "sweeps" / name / "report" / "index.html").read_text()
        rows = {number: state for state, number in re.findall(r'<tr class="(\w+)"><td>(\d+)</td>', page)}
        assert rows == {"0": "failed", "1": "running"}, rows
        assert "1 failed" in page and "1 running" in page
    finally:
        kill_group(sweep, signal.SIGINT)
        sweep.wait(timeout=120)


def test_seqae_ui_stops_both_servers_on_sighup(finished_sweep, tmp_path):
    """A closed terminal's SIGHUP stops both servers, as Ctrl-C does (and a process manager's
    SIGTERM: tests/test_move.py)."""
    ui, mlflow_port, optuna_port = start_ui(finished_sweep, tmp_path / "ui.log")
    try:
        for port in (mlflow_port, optuna_port):  # both really serve before the signal
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except BaseException:
        kill_group(ui)
        raise
    stop_ui(ui, signal.SIGHUP, tmp_path / "ui.log", (mlflow_port, optuna_port))


def test_the_ui_beside_a_running_sweep_never_fails_it(tmp_path):
    """optuna-dashboard on the same SQLite file as a running study has crashed studies with
    "database is locked" (optuna/optuna-dashboard#545): here both UIs serve, and Chromium loads
    their pages over and over while a sweep writes, four times each before the sweep is stopped
    (its trials have 1,000 epochs: it cannot end sooner) and on until it has stopped; it must end
    with no trial failed, the one it ran stopped at its epoch to continue."""
    from selenium.webdriver.common.by import By

    from tests.sweep_helpers import optuna_trials

    workspace, log = tmp_path / "ws", tmp_path / "sweep.log"
    sweep = start(
        "sweep",
        "run",
        str(STUDIES / "quickstart.yaml"),
        "--name",
        "busy",
        "--workspace",
        str(workspace),
        *sets(
            *SMOKE,
            "data.input_len=16",
            "model.latent_len=8",
            "trials.total=2",
            "train.epochs=1000",
            "train.patience=1000",
        ),
        log=log,
    )
    try:
        wait_for(
            lambda: "trial 0  epoch 1/" in log.read_text() or "trial 1  epoch 1/" in log.read_text(),
            300,
            "the sweep's first result",
        )
        ui, mlflow_port, optuna_port = start_ui(workspace, tmp_path / "ui.log")
        try:
            driver = browser()
            loads, stopped = 0, False
            try:
                while sweep.poll() is None:
                    for url in (
                        f"http://127.0.0.1:{mlflow_port}/#/experiments",
                        f"http://127.0.0.1:{optuna_port}/dashboard",
                    ):
                        driver.get(url)
                        wait_for(lambda: "busy" in driver.find_element(By.TAG_NAME, "body").text, 60, url)
                        loads += 1
                    if loads >= 8 and not stopped:
                        assert sweep.poll() is None, "the sweep ended before the pages were read beside it"
                        stopped = seqae("sweep", "stop", "busy", "--now", "--workspace", str(workspace)).returncode == 0
                        assert stopped
            finally:
                driver.quit()
        finally:
            stop_ui(ui, signal.SIGINT, tmp_path / "ui.log", (mlflow_port, optuna_port))
        assert sweep.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        kill_group(sweep)
    assert stopped and "sweep busy: stopped" in log.read_text()
    states = [t.state.name for t in optuna_trials(workspace, "busy")]
    assert states == ["RUNNING"], states
