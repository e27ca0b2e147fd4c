"""The documentation's pictures, taken of real pages by a headless Chromium:

    python docs/screenshot.py report [WORKSPACE [SWEEP]]   # docs/images/report.png, of a sweep's report
                                                            # (default: ./seqae-runs, quickstart)
    python docs/screenshot.py readme OUT.png                # README.md as it renders, pictures included
    python docs/screenshot.py watch [NOTEBOOK]              # docs/images/watch.png, Sweep.watch() in a notebook
                                                            # (default: test-screenshots/watch.ipynb, which
                                                            # tests/test_watch.py writes)

Run the quickstart first for the report's picture (README: The main job)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import markdown

from dashboards.browser import headless_chromium
from dashboards.report.page import template_digest

DOCS = Path(__file__).resolve().parent
REPORT_PICTURE = DOCS / "images" / "report.png"
REPORT_DIGEST = DOCS / "images" / "report.png.templates-sha256"  # tests/test_reference.py compares it
WATCH_PICTURE = DOCS / "images" / "watch.png"


def picture(page: Path, out: Path, height: int = 1100) -> Path:
    driver = headless_chromium(height=height)
    try:
        driver.get(page.resolve().as_uri())
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
    return out


def readme(out: Path) -> Path:
    """README.md rendered as GitHub shows it: its markdown as HTML, its pictures from docs/."""
    body = markdown.markdown((DOCS.parent / "README.md").read_text(), extensions=["tables", "fenced_code"])
    style = (
        "body{font-family:sans-serif;max-width:900px;margin:2em auto;line-height:1.5} img{max-width:100%} "
        "pre{background:#f6f8fa;padding:1em;overflow:auto} code{background:#f6f8fa}"
    )
    with tempfile.TemporaryDirectory(dir=DOCS.parent) as tmp:  # beside README.md, so its relative links resolve
        page = Path(tmp) / "README.html"
        page.write_text(
            f"<!doctype html><meta charset='utf-8'><base href='{DOCS.parent.as_uri()}/'><style>{style}</style>{body}"
        )
        return picture(page, out, height=2400)


def notebook(path: Path, out: Path) -> Path:
    """An executed notebook as JupyterLab's classic HTML export shows it (nbconvert's)."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_filename(str(path))
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "notebook.html"
        page.write_text(body)
        return picture(page, out, height=480)


if __name__ == "__main__":
    what, *rest = sys.argv[1:] or ["report"]
    if what == "readme":
        print(readme(Path(rest[0])))
    elif what == "watch":
        print(notebook(Path(rest[0] if rest else DOCS.parent / "test-screenshots" / "watch.ipynb"), WATCH_PICTURE))
    else:
        workspace, name = (rest + ["seqae-runs", "quickstart"][len(rest) :])[:2]
        print(picture(Path(workspace) / "sweeps" / name / "report" / "index.html", REPORT_PICTURE))
        REPORT_DIGEST.write_text(template_digest() + "\n")  # the templates this picture shows
