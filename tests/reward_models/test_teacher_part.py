"""The teacher reward part: loaded once per stage from its options, it scores each sampled
token with the teacher's log-prob minus the student's, and the rewarder turns its weighted
scores into the step's token rewards (the output's sum into its one reward)."""

from pathlib import Path

import pytest

from flows.config_files import load_config
from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.rollout import RolloutBatch
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.base import Problem
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy, load_policy
from grpo_core.model.teacher import Teacher
from reward_models.grpo_reward import GRPORewarder
from reward_models.parts import REWARD_PARTS


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny policy of the built-in character tokenizer, saved as a teacher checkpoint."""
    path = tmp_path_factory.mktemp("teacher")
    tokenizer = build_char_tokenizer()
    cfg = PolicyConfig(n_layers=1, hidden_size=16, n_heads=2, intermediate_size=32, seed=7)
    create_tiny_policy(cfg, tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def sampled(texts: list[str], logprob: float) -> RolloutBatch:
    """Outputs of one prompt, each token sampled at log-prob `logprob`."""
    tok = build_char_tokenizer()
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    prompt = tok("1+1=")["input_ids"]
    return RolloutBatch(
        [0] * len(ids),
        [prompt] * len(ids),
        ids,
        texts,
        ["stop"] * len(ids),
        [[logprob] * len(i) for i in ids],
    )


def test_the_teacher_part_scores_each_token_and_sums_them_per_output(teacher_dir: Path) -> None:
    weights = load_config(
        "micro",
        [
            "grpo.rewards.orm=0",
            "grpo.rewards.verifier=0",
            "grpo.rewards.teacher=2",
            f"grpo.rewards.teacher_path={teacher_dir}",
        ],
    ).grpo.rewards
    rewarder = GRPORewarder(
        ArithTask(), weights, build_char_tokenizer(), 20, temperature=0.7, device="cpu"
    )
    assert isinstance(rewarder.loaded["teacher"], Teacher)  # loaded once, with the rewarder
    batch = sampled(["2\n#### 2", "#### 3", ""], logprob=-1.5)
    rewards = rewarder([Problem("p0", "1+1", "2")], ["1+1="], batch)
    model, _ = load_policy(teacher_dir)
    want = Teacher(model.eval(), 0).token_logprobs(batch.prompt_ids, batch.completion_ids, 0.7)
    per_token = [[2.0 * (t + 1.5) for t in row] for row in want]  # weight 2 x (teacher - student)
    assert rewards.token_rewards is not None
    assert [len(r) for r in rewards.token_rewards] == [8, 6, 0]
    for got, expected in zip(rewards.token_rewards, per_token, strict=True):
        assert got == pytest.approx(expected, abs=1e-5)
    sums = [sum(t + 1.5 for t in row) for row in want]
    assert rewards.parts["teacher"].tolist() == pytest.approx(sums, abs=1e-4)  # unweighted
    assert rewards.total.tolist() == pytest.approx([2.0 * s for s in sums], abs=1e-4)
    assert rewards.rm is None  # the teacher is not a learned reward model


def test_without_a_weight_the_teacher_is_neither_loaded_nor_scored() -> None:
    weights = load_config("micro", ["grpo.rewards.orm=0"]).grpo.rewards
    rewarder = GRPORewarder(ArithTask(), weights, build_char_tokenizer(), 20)
    assert rewarder.loaded == {}
    rewards = rewarder([Problem("p0", "1+1", "2")], ["1+1="], sampled(["#### 2"], -1.0))
    assert rewards.token_rewards is None and "teacher" not in rewards.parts


def test_a_teacher_without_a_path_is_refused_naming_the_field() -> None:
    load = REWARD_PARTS["teacher"].load
    assert load is not None
    options = {"path": None, "dtype": "float32", "micro_batch_size": None}
    with pytest.raises(SettingError, match=r"needs grpo\.rewards\.teacher_path"):
        load(options, "cpu")
