"""`seqae sweep compare` (dashboards/compare.py, dashboards/compare_page.py) on real Optuna studies, real
checkpoint records and a real workspace; no training."""

from __future__ import annotations

import re

import pytest

from dashboards.compare import compare
from seqae_errors import ConfigError
from tests.test_status import quickstart, run_trials, start_sweep, template, workspace, write_sweep  # noqa: F401


def sweep(workspace, name, plans, *extra, forked_from=None):  # noqa: F811
    state = write_sweep(workspace, name, quickstart(*extra))
    state.forked_from = forked_from
    workspace.write(state)
    run_trials(start_sweep(workspace, state), state.backends.storage, plans)


def test_two_sweeps_side_by_side_in_the_terminal_and_on_a_page(workspace, tmp_path):  # noqa: F811
    sweep(workspace, "origin", [([60.0, 60.0], 0.70, True), ([60.0], 0.50, False)])
    sweep(workspace, "fork", [([30.0], 0.80, True), ([30.0], 0.75, True)], forked_from="origin")

    text, page = compare(workspace, ["origin", "fork"], str(tmp_path / "page"))

    lines = text.splitlines()
    assert lines[0].split()[:3] == ["sweep", "trials", "best"]
    assert re.search(
        r"^origin\s+2: 1 complete, 1 pruned\s+0 \(paper_lr\)\s+0\.7000\s+-\s+0\.050\s+-$", lines[1], re.M
    ), text
    assert re.search(r"^fork\s+2: 2 complete\s+0 \(paper_lr\)\s+0\.8000\s+-\s+0\.017\s+origin$", lines[2], re.M), text
    html = page.read_text()
    assert page.parent == tmp_path / "page" and html.count("data:image/png;base64,") == 2
    assert "<td>fork</td>" in html and "best val_token_accuracy so far against resource-seconds spent" in html


def test_what_cannot_be_compared_is_refused_by_name(workspace):  # noqa: F811
    sweep(workspace, "a", [([10.0], 0.5, True)])
    sweep(workspace, "b", [], "objective={metric: val_loss, mode: min}")
    for names, says in (
        (["a"], "two sweeps or more, got 1"),
        (["a", "nope"], "no sweep named 'nope'"),
        (["a", "b"], "different objectives: a: val_token_accuracy \\(max\\), b: val_loss \\(min\\)"),
    ):
        with pytest.raises(ConfigError, match=says):
            compare(workspace, names)
    assert not (workspace.root / "compare").exists()
