"""The generated reference (docs/hooks.py) describes every key: a key added without a description
fails here, not in a user's reading."""

from __future__ import annotations

from docs.hooks import config_keys, sweep_fields, sweep_keys
from tests.conftest import REPO
from seqae_core import config as config_lib
from seqae_core import metrics as M


def test_every_sweep_file_key_has_a_description():
    fields = dict(sweep_fields())
    assert {"scheduler.type", "search.KEY.when", "budget.cpu_hours", "notify.events", "objective.metric"} <= set(fields)
    assert [key for key, info in fields.items() if not (info.description or "").strip()] == []


def test_the_objective_names_every_metric_it_may_use_and_the_page_lists_every_key():
    assert all(metric in dict(sweep_fields())["objective.metric"].description for metric in M.OBJECTIVES)
    page = sweep_keys()
    assert all(f"| `{key}` |" in page for key, _ in sweep_fields())
    assert "one of `loguniform`, `uniform`, `int`, `categorical`" in page  # the distribution types


def test_every_config_key_has_a_description():
    rows = {line.split("|")[1].strip(" `"): line.split("|")[4].strip()
            for line in config_keys().splitlines() if line.startswith("| `")}
    assert set(rows) == set(config_lib.KEYS)
    assert [key for key, meaning in rows.items() if not meaning] == []


def test_the_readmes_picture_of_a_report_shows_todays_templates():
    """docs/screenshot.py records the templates' digest beside the picture it takes."""
    from dashboards.report import template_digest

    recorded = (REPO / "docs" / "images" / "report.png.templates-sha256").read_text().strip()
    assert recorded == template_digest(), (
        "the report's templates changed since docs/images/report.png was taken: run the quickstart, then "
        "python docs/screenshot.py report")
