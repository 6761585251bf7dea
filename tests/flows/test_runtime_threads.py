"""run.num_threads and the $ITERGRPO_MAX_THREADS cap (flows/runtime.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from flows.errors import ConfigError
from flows.runtime import MAX_THREADS_ENV, apply_threads


@pytest.fixture
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("restore_threads")
@pytest.mark.parametrize(
    ("cap", "num_threads", "expected"),
    [
        (None, 2, 2),  # no cap: run.num_threads
        ("1", 2, 1),  # the cap wins over a larger run.num_threads
        ("3", 2, 2),  # a cap above run.num_threads changes nothing
        ("1", None, 1),  # unset run.num_threads (torch's default) is capped too
    ],
)
def test_the_cap_bounds_run_num_threads(
    monkeypatch: pytest.MonkeyPatch, cap: str | None, num_threads: int | None, expected: int
) -> None:
    if cap is None:
        monkeypatch.delenv(MAX_THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(MAX_THREADS_ENV, cap)
    torch.set_num_threads(4)
    apply_threads(num_threads)
    assert torch.get_num_threads() == expected


@pytest.mark.usefixtures("restore_threads")
def test_without_cap_or_setting_torch_keeps_its_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_THREADS_ENV, raising=False)
    torch.set_num_threads(3)
    apply_threads(None)
    assert torch.get_num_threads() == 3


@pytest.mark.parametrize("bad", ["0", "two", "-1", "1.5"])
def test_a_bad_cap_names_the_variable(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv(MAX_THREADS_ENV, bad)
    with pytest.raises(ConfigError, match=rf"{MAX_THREADS_ENV}='{bad}'.*whole number"):
        apply_threads(2)
