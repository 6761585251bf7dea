"""On-policy distillation's settings: refused at load without a per-token reward to read, and
refused at pre-flight without a teacher that reads the student's tokens (one line naming both)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flows.config import ItergrpoConfig
from flows.config_files import load_config
from flows.errors import ConfigError, PreflightError
from flows.preflight_data import check_policy_and_data
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy

DISTILL = ("grpo.algo.adv_estimator=distill", "grpo.algo.beta=0", "grpo.rewards.orm=0")


def saved_teacher(path: Path, alphabet: str | None = None) -> Path:
    tokenizer = build_char_tokenizer(alphabet) if alphabet else build_char_tokenizer()
    cfg = PolicyConfig(n_layers=1, hidden_size=16, n_heads=2, intermediate_size=32)
    create_tiny_policy(cfg, tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def distill_config(store: Path, *overrides: str) -> ItergrpoConfig:
    return load_config(
        "micro",
        [f"store.root={store}", "run.run_id=d", *DISTILL, "grpo.rewards.teacher=1", *overrides],
    )


def test_the_distill_estimator_without_a_per_token_part_is_refused() -> None:
    with pytest.raises(ConfigError, match="reads a reward per token, but no per-token reward part"):
        load_config("micro", list(DISTILL))


def test_the_distill_config_distils_into_a_smaller_student() -> None:
    cfg = load_config("distill")
    assert cfg.grpo.algo.adv_estimator == "distill"
    assert cfg.grpo.rewards.weight("teacher") == 1.0
    assert cfg.grpo.rewards.options("teacher")["path"].endswith("policy/iter-3")
    demo = load_config("demo")
    assert cfg.policy.hidden_size < demo.policy.hidden_size  # the teacher is the demo's policy


def test_a_teacher_of_another_tokenizer_is_refused_naming_both(tmp_path: Path) -> None:
    teacher = saved_teacher(tmp_path / "t", alphabet="0123456789+=#\n ")
    cfg = distill_config(tmp_path, f"grpo.rewards.teacher_path={teacher}")
    with pytest.raises(PreflightError) as err:
        check_policy_and_data(cfg)
    line = str(err.value)
    assert "\n" not in line
    assert f"the teacher at {teacher} cannot score the tokens of the student" in line
    assert "policy.kind tiny: the character tokenizer of policy.alphabet" in line
    assert "their vocabularies differ" in line


def test_a_teacher_is_a_model_directory(tmp_path: Path) -> None:
    with pytest.raises(PreflightError, match=r"needs grpo\.rewards\.teacher_path"):
        check_policy_and_data(distill_config(tmp_path))
    missing = tmp_path / "nothing"
    cfg = distill_config(tmp_path, f"grpo.rewards.teacher_path={missing}")
    with pytest.raises(
        PreflightError, match=re.escape(f"teacher_path {missing} is not an HF model directory")
    ):
        check_policy_and_data(cfg)


def test_a_teacher_of_the_students_tokenizer_passes(tmp_path: Path) -> None:
    teacher = saved_teacher(tmp_path / "t")
    check_policy_and_data(distill_config(tmp_path, f"grpo.rewards.teacher_path={teacher}"))
