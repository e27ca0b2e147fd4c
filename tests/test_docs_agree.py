"""The documents agree with each other: one torch range (pyproject.toml's), which every torch the
README, the cluster launcher and CI install falls in; and docs/index.md lists every page of the
site's navigation."""

from __future__ import annotations

import re

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.conftest import REPO

INSTALLERS = ("README.md", "cluster/aws.yaml", ".ci/run", "docs/tutorial/first-sweep.md")


def torch_range() -> SpecifierSet:
    (spec,) = re.findall(r'"torch([<>=!~][^"]*)"', (REPO / "pyproject.toml").read_text())
    return SpecifierSet(spec)


def test_every_torch_the_documents_install_is_in_pyprojects_range():
    allowed = torch_range()
    pins = {(name, pin) for name in INSTALLERS for pin in re.findall(r"torch==([\w.*+]+)", (REPO / name).read_text())}
    assert {(name, pin) for name, pin in pins if "*" in pin or Version(pin) not in allowed} == set()
    # and no other range is written beside it (a wildcard pin above is one too)
    ranges = {
        (name, spec)
        for name in INSTALLERS
        for spec in re.findall(r"torch\s*(>=|<=|~=|<|>)[\d.]+", (REPO / name).read_text())
    }
    assert ranges == set()


def test_the_index_lists_every_page_of_the_site():
    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [p for item in nav for p in pages(item)]
        if isinstance(nav, dict):
            return [p for value in nav.values() for p in pages(value)]
        return []

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    index = (REPO / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w/.-]+\.md)(?:#[\w-]*)?\)", index))
    assert [page for page in pages(config["nav"]) if page != "index.md" and page not in linked] == []


def test_the_readmes_links_reach_their_pages_and_headings():
    from markdown.extensions.toc import slugify

    readme = (REPO / "README.md").read_text()
    broken = []
    for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([\w-]+))?\)", readme):
        if "://" in target:
            continue
        path = REPO / target
        headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M) if path.suffix == ".md" and path.exists() else []
        if not path.exists() or (anchor and anchor not in {slugify(h, "-") for h in headings}):
            broken.append(f"{target}#{anchor}" if anchor else target)
    assert broken == []
