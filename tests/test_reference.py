"""The generated reference (docs/hooks.py) describes every key: a key added without a description
fails here, not in a user's reading; the committed pages are what the code generates today, and
the README's table of verbs names every verb."""

from __future__ import annotations

import re

from docs.hooks import PAGES, _commands, config_keys, render, stale, sweep_fields, sweep_keys
from seqae.cli.parser import build_parser
from seqae_core import config as config_lib
from seqae_core import metrics as M
from tests.conftest import REPO


def test_every_sweep_file_key_has_a_description():
    fields = dict(sweep_fields())
    assert {"scheduler.type", "search.KEY.when", "budget.cpu_hours", "notify.events", "objective.metric"} <= set(fields)
    assert [key for key, info in fields.items() if not (info.description or "").strip()] == []


def test_the_objective_names_every_metric_it_may_use_and_the_page_lists_every_key():
    assert all(metric in dict(sweep_fields())["objective.metric"].description for metric in M.OBJECTIVES)
    page = sweep_keys()
    assert all(f"| `{key}` |" in page for key, _ in sweep_fields())
    assert "one of `loguniform`, `uniform`, `int`, `categorical`, `ordered`" in page  # the distribution types


def test_every_config_key_has_a_description():
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[4].strip()
        for line in config_keys().splitlines()
        if line.startswith("| `")
    }
    assert set(rows) == set(config_lib.KEYS)
    assert [key for key, meaning in rows.items() if not meaning] == []


def test_the_readmes_picture_of_a_report_shows_todays_templates():
    """docs/screenshot.py records the templates' digest beside the picture it takes."""
    from dashboards.report.page import template_digest

    recorded = (REPO / "docs" / "images" / "report.png.templates-sha256").read_text().strip()
    assert recorded == template_digest(), (
        "the report's templates changed since docs/images/report.png was taken: run the quickstart, then "
        "python docs/screenshot.py report"
    )


def test_the_committed_reference_pages_are_what_the_code_generates():
    """GitHub shows the committed pages as they are: a verb, key or description changed without
    `python -m docs.hooks --write` leaves them stale."""
    assert all("<!-- end generated:" in page.read_text() for page in PAGES.values())
    pages = [str(page.relative_to(REPO)) for page in stale()]
    assert not pages, f"stale reference pages {pages}: run python -m docs.hooks --write and commit them"


def test_a_stale_generated_part_is_made_anew():
    page = "# Title\n\n<!-- generated: sweep-keys -->\nan old table\n<!-- end generated: sweep-keys -->\nafter\n"
    made = render(page)
    assert "an old table" not in made and made.endswith("<!-- end generated: sweep-keys -->\nafter\n")
    assert (
        render(made) == made
        and render("<!-- generated: sweep-keys -->\n") == made[len("# Title\n\n") : -len("after\n")]
    )


def test_the_readmes_table_of_verbs_names_every_verb():
    table = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `seqae ")]
    named = set()
    for row in table:
        first, *rest = re.findall(r"`([^`]+)`", row.split("|")[1])
        named.add(first)
        named.update(f"{first.rsplit(' ', 1)[0]} {verb}" for verb in rest)
    leaves = {
        path
        for path, parser in _commands(build_parser(), "seqae")[1:]
        if not any(other.startswith(path + " ") for other, _ in _commands(build_parser(), "seqae"))
    }
    assert leaves - named == set() and named - leaves == set()
