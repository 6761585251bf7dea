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
