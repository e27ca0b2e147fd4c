"""`Sweep.watch()`: in a Jupyter notebook one table that updates in place while the sweep's trials
end, in a terminal a line each time the sweep changes and its table at the end."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from seqae import Sweep
from sweeps.stores.search import SweepStudy, open_study
from tests.conftest import REPO
from tests.sweep_helpers import STUDIES, TINY, wait_for

TRIALS = 3


def running_sweep(workspace: Path) -> SweepStudy:
    """A quickstart sweep whose study holds TRIALS running trials, as a driver leaves them while
    they train; the test ends them (its study is what the view reads)."""
    sweep = Sweep.create(
        STUDIES / "quickstart.yaml", set=[*TINY, f"trials.total={TRIALS}"], name="q", workspace=workspace
    )
    state = sweep.workspace.read("q")
    driver = open_study(state.spec, state.backends.optuna_storage, "q", TRIALS, state.fingerprint)
    for _ in range(TRIALS):
        driver.next_trial()
    return driver


def test_watch_in_a_terminal_prints_a_line_per_change_and_the_table_at_the_end(tmp_path, capsys):
    """Watching from a plain Python: the trials end one by one (each after the view showed the
    one before), a line for each state the sweep went through, none for a poll that saw no change,
    and the table of every trial once it ended."""
    driver = running_sweep(tmp_path / "ws")
    sweep = Sweep("q", tmp_path / "ws")
    views: list = []
    printed: list[str] = []

    def out() -> str:
        printed.append(capsys.readouterr().out)
        return "".join(printed)

    watcher = threading.Thread(target=lambda: views.append(sweep.watch(every=0.05, timeout=120)))
    watcher.start()
    for number in range(TRIALS):
        wait_for(
            lambda n=number: f"COMPLETE {n}" in out() if n else f"RUNNING {TRIALS}" in out(),
            60,
            f"the view of {number} ended trials",
        )
        driver.study.tell(number, 0.5 + number / 10)
    watcher.join(120)
    text = out()
    print(text)
    assert views and views[0].ended, text
    headings = [line for line in text.splitlines() if line.startswith("sweep q: ")]
    assert len(headings) == TRIALS + 1, headings  # the first view, then one per trial that ended
    assert headings[0].startswith(f"sweep q: not started, {TRIALS} trials (RUNNING {TRIALS}); no trial completed; at ")
    assert headings[-1].startswith(
        f"sweep q: not started, {TRIALS} trials (COMPLETE {TRIALS}); best: trial 2  val_token_accuracy 0.7000; at "
    ), headings
    assert [r[:2] for r in views[0].rows] == [["2", "COMPLETE"], ["1", "COMPLETE"], ["0 (paper_lr)", "COMPLETE"]]
    table = text.split(headings[-1], 1)[1]
    assert table.splitlines()[1].split()[:2] == ["trial", "state"] and table.count("COMPLETE") == TRIALS, table


NOTEBOOK_CELL = """\
from seqae import Sweep

view = Sweep("q", {workspace!r}).watch(every=0.1, timeout=120)
"""


@pytest.mark.slow
def test_watch_in_a_notebook_updates_one_table_in_place(tmp_path, screenshot_dir):
    """A notebook run by nbclient in a real IPython kernel watches a sweep whose trials end one by
    one (each after the kernel's view showed the one before): one display, updated in place
    through its display id as each trial ends, no printed line; the executed notebook keeps one
    output, the table of every trial COMPLETE. The view after the first trial ended is saved beside
    the screenshots, for docs/screenshot.py's picture."""
    import nbformat
    from nbclient import NotebookClient

    driver = running_sweep(tmp_path / "ws")
    seen: list[dict] = []

    class Recording(NotebookClient):
        def process_message(self, msg, cell, cell_index):  # every message the kernel sends for the cell
            if msg["msg_type"] in ("display_data", "update_display_data", "stream"):
                seen.append(msg)
            return super().process_message(msg, cell, cell_index)

    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(NOTEBOOK_CELL.format(workspace=str(tmp_path / "ws")))]
    )
    client = Recording(notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(REPO)}})
    errors: list[BaseException] = []

    def execute() -> None:
        try:
            client.execute()
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            errors.append(exc)

    kernel = threading.Thread(target=execute)
    kernel.start()

    def shown() -> str:
        displays = [m for m in seen if m["msg_type"] != "stream"]
        return displays[-1]["content"]["data"].get("text/html", "") if displays else ""

    for number in range(TRIALS):
        wait_for(
            lambda n=number: not errors and (f"COMPLETE {n}" in shown() if n else bool(shown())),
            180,
            f"the notebook's view of {number} ended trials",
        )
        if number == 1:  # the view while the sweep runs: docs/screenshot.py's picture of it
            live = nbformat.v4.new_notebook(
                cells=[
                    nbformat.v4.new_code_cell(
                        notebook.cells[0].source,
                        outputs=[nbformat.v4.new_output("display_data", data={"text/html": shown()})],
                    )
                ]
            )
            nbformat.write(live, screenshot_dir / "watch.ipynb")
        driver.study.tell(number, 0.5 + number / 10)
    kernel.join(240)
    assert not errors, errors
    # on stderr only the TqdmWarning of Optuna's `tqdm.auto` in a kernel without ipywidgets
    assert not [m for m in seen if m["msg_type"] == "stream" and m["content"]["name"] == "stdout"], seen
    kinds = [m["msg_type"] for m in seen if m["msg_type"] != "stream"]
    assert kinds[0] == "display_data" and set(kinds[1:]) == {"update_display_data"} and len(kinds) > TRIALS, kinds
    assert len({m["content"]["transient"]["display_id"] for m in seen if m["msg_type"] != "stream"}) == 1  # one display
    outputs = [o for o in notebook.cells[0].outputs if o["output_type"] != "stream"]
    assert len(outputs) == 1 and outputs[0]["output_type"] == "display_data", outputs
    table = outputs[0]["data"]["text/html"]
    assert table.count("<td style='text-align:left'>COMPLETE</td>") == TRIALS and "RUNNING" not in table
    assert f"sweep q: not started, {TRIALS} trials (COMPLETE {TRIALS})" in table
