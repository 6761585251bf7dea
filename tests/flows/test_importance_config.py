"""grpo.algo.importance_sampling and grpo.algo.rollout_correction in the run config: the choices
load, nonsense is refused at load naming the field and the fix."""

from __future__ import annotations

import pytest

from flows.config_files import ConfigError, load_config


def test_gspo_and_the_correction_load_with_their_papers_defaults() -> None:
    cfg = load_config(
        "micro",
        [
            "grpo.algo.importance_sampling=sequence_token",
            "grpo.algo.rollout_correction.mode=mis",
            "grpo.algo.rollout_correction.level=sequence",
        ],
    )
    algo = cfg.grpo.algo
    assert algo.clip_range == (3e-4, 4e-4)
    assert (algo.rollout_correction.mode, algo.rollout_correction.cap) == ("mis", 2.0)
    assert algo.reads_sampling_logprobs


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["grpo.algo.rollout_correction.cap=1"], ["grpo.algo.rollout_correction.cap", "than 1"]),
        (["grpo.algo.rollout_correction.cap=0.5"], ["grpo.algo.rollout_correction.cap"]),
        (["grpo.algo.sequence_eps_low=0"], ["grpo.algo.sequence_eps_low", "greater than 0"]),
        (["grpo.algo.sequence_eps_high=-0.1"], ["grpo.algo.sequence_eps_high"]),
        (["grpo.algo.sequence_eps_low=1"], ["grpo.algo.sequence_eps_low", "less than 1"]),
        (["grpo.algo.importance_sampling=seq"], ["grpo.algo.importance_sampling", "'sequence'"]),
        (["grpo.algo.rollout_correction.mode=is"], ["grpo.algo.rollout_correction.mode", "'tis'"]),
        (
            [
                "grpo.algo.rollout_correction.mode=tis",
                "grpo.algo.use_sampling_logprobs_as_old=true",
            ],
            ["1 everywhere", "grpo.algo.use_sampling_logprobs_as_old: false"],
        ),
        (
            ["grpo.preset=sft", "grpo.algo.rollout_correction.mode=mis"],
            ["data_source = gold", "grpo.algo.rollout_correction.mode: off"],
        ),
    ],
)
def test_nonsense_is_refused_naming_the_field(overrides: list[str], names: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", overrides)
    for name in names:
        assert name in str(err.value)
