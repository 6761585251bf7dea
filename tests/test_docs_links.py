"""Every relative link in the README and docs/ points at a file that exists (pages moved
between README and docs/ must not leave dead links behind)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "bench" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    dead = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, a data: URI or an anchor on the same page
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            dead.append(target)
    assert not dead, f"{page.relative_to(ROOT)} links to missing files: {dead}"


# Documents a user of the repository does not have: the formulas live in docs/algorithm.md.
OUTSIDE = re.compile(r"GRPO_SPEC|DESIGN\.md|STYLE\.md|\.\./shared/")
SOURCES = [
    p
    for folder in ("flows", "grpo_core", "reward_models", "storage", "tests", "bench", "configs")
    for p in sorted((ROOT / folder).rglob("*"))
    if p.suffix in (".py", ".yaml", ".md", ".sh")
]


def test_nothing_cites_a_file_outside_the_repository() -> None:
    pages = [*PAGES, *SOURCES, ROOT / "Makefile"]
    citing = [
        str(p.relative_to(ROOT))
        for p in pages
        if p != Path(__file__) and OUTSIDE.search(p.read_text(errors="replace"))
    ]
    assert not citing, f"cite files outside the repository (use docs/algorithm.md): {citing}"


# `path.py::name` in docs/algorithm.md: the function (or test) that implements or checks a
# formula; a rename must not leave the page naming something that is gone. A bare file name
# (`test_losses.py::...`, after its full path on the page) is the one file of that name.
NAMED = re.compile(r"`([\w/]+\.py)::(\w+)`")


def _source(path: str) -> Path:
    if "/" in path:
        return ROOT / path
    found = [p for p in SOURCES if p.name == path]
    return found[0] if len(found) == 1 else ROOT / path


def test_functions_the_algorithm_page_names_exist() -> None:
    missing = []
    for path, name in NAMED.findall((ROOT / "docs" / "algorithm.md").read_text()):
        source = _source(path)
        defined = re.compile(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b", re.MULTILINE)
        if not source.is_file() or not defined.search(source.read_text()):
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/algorithm.md names what does not exist: {missing}"
