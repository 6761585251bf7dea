"""docs/configuration.md is what flows/config_docs.py generates from the config's own field
descriptions: a field added, renamed or re-described without regenerating the page fails."""

from __future__ import annotations

from pathlib import Path

from flows.config import ItergrpoConfig
from flows.config_docs import configuration_page

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_page_is_the_generated_one() -> None:
    assert PAGE.read_text() == configuration_page(), (
        "docs/configuration.md is stale: run `python -m flows.config_docs > docs/configuration.md`"
    )


def test_every_field_of_every_section_has_a_row_with_its_description() -> None:
    page = configuration_page()
    grpo = ItergrpoConfig.model_fields["grpo"].annotation
    assert grpo is not None
    for name, field in grpo.model_fields.items():  # type: ignore[union-attr]
        assert f"| `{field.alias or name}` |" in page  # grpo.async: `async_` in code
        assert " ".join((field.description or "").split()) in " ".join(page.split())
    assert "## `grpo.algo`" in page and "## `guards`" in page
