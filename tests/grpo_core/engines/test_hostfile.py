"""engines.deepspeed.hostfile is checked before any stage: a missing or malformed hostfile is
a SettingError naming the field and the expected line form."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_core.contracts.errors import SettingError
from grpo_core.engines.config import DeepSpeedConfig
from grpo_core.engines.registry import check_hostfile, require_deepspeed


def test_a_hostfile_of_host_slots_lines_passes(tmp_path: Path) -> None:
    good = tmp_path / "hostfile"
    good.write_text("# two nodes\nworker-1 slots=8\n\nworker-2 slots=8  # the second\n")
    check_hostfile(good)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("worker-1\n", "line 'worker-1'"),
        ("worker-1 slots=0\n", "line 'worker-1 slots=0'"),
        ("worker-1 gpus=8\n", "line 'worker-1 gpus=8'"),
        ("# only a comment\n", "no host line"),
    ],
)
def test_a_malformed_hostfile_names_the_line_and_the_form(
    tmp_path: Path, text: str, named: str
) -> None:
    bad = tmp_path / "hostfile"
    bad.write_text(text)
    with pytest.raises(SettingError, match=r"engines\.deepspeed\.hostfile") as err:
        check_hostfile(bad)
    assert named in str(err.value) and "'HOST slots=N'" in str(err.value)


def test_a_missing_hostfile_is_refused_with_the_engine_check(tmp_path: Path) -> None:
    settings = DeepSpeedConfig(hostfile=str(tmp_path / "nowhere"))
    with pytest.raises(SettingError, match="cannot be read"):
        require_deepspeed(settings)
