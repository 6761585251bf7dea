"""grpo.lora: its fields refuse what cannot run, naming the field and the fix; the GRPO stage
alone reads it; a run with it enabled and peft missing is refused before it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config_files import ConfigError
from flows.config_readers import stages_reading
from flows.names import GRPO, ITERATION_STAGES
from flows.preflight_data import check_policy_and_data
from grpo_core.contracts.errors import SettingError
from grpo_core.model import lora as lora_module
from grpo_core.model.config import LLAMA_PROJECTIONS
from tests.flow_helpers import micro_config


def test_defaults_are_off_and_adapt_the_llama_projections(tmp_path: Path) -> None:
    lora = micro_config(tmp_path, "c").grpo.lora
    assert not lora.enabled
    assert lora.target_modules == list(LLAMA_PROJECTIONS)
    assert (lora.r, lora.alpha, lora.dropout) == (8, 16, 0.0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("grpo.lora.target_modules=[]", "grpo.lora.target_modules must list at least one"),
        ("grpo.lora.target_modules=[q_proj, q_proj]", r"names \['q_proj'\] twice"),
        ("grpo.lora.r=0", "grpo.lora.r"),
        ("grpo.lora.alpha=0", "grpo.lora.alpha"),
        ("grpo.lora.dropout=1.0", "grpo.lora.dropout"),
    ],
)
def test_bad_fields_are_refused_naming_them(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        micro_config(tmp_path, "c", override)


@pytest.mark.parametrize(
    "engine", ["engines.train=deepspeed", "engines.train_workers=ray"], ids=["deepspeed", "ray"]
)
def test_lora_with_deepspeed_or_ray_ranks_is_refused_with_the_fix(
    tmp_path: Path, engine: str
) -> None:
    with pytest.raises(
        ConfigError,
        match=r"grpo\.lora\.enabled = true with engines\.train = .*Set engines\.train: torch "
        r"and engines\.train_workers: none, or grpo\.lora\.enabled: false",
    ):
        micro_config(tmp_path, "c", "grpo.lora.enabled=true", engine)


def test_only_the_grpo_stage_reads_it() -> None:
    assert stages_reading("grpo.lora.r") == frozenset({GRPO})
    # the rest of grpo: every stage after the warm start
    assert stages_reading("grpo.steps") == frozenset(ITERATION_STAGES)


def test_missing_peft_refuses_the_run_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lora_module, "find_spec", lambda name: None)
    cfg = micro_config(tmp_path, "c", "grpo.lora.enabled=true")
    with pytest.raises(SettingError, match=r"peft is not installed.*pip install -e '\.\[lora\]'"):
        check_policy_and_data(cfg)
    check_policy_and_data(micro_config(tmp_path, "c"))  # without LoRA, peft is not needed
