"""grpo.async in the run config: `async` in YAML, dumps and --set (async_ in code), off by
default, and what it cannot serve refused at load naming the field and the fix."""

from __future__ import annotations

import pytest

from flows.config import ItergrpoConfig
from flows.config_files import ConfigError, load_config

ON = ["grpo.async.max_staleness=2", "grpo.algo.use_sampling_logprobs_as_old=true"]


def test_async_is_off_by_default_and_round_trips_under_its_yaml_name() -> None:
    assert not load_config("micro").grpo.async_.on
    cfg = load_config("micro", [*ON, "grpo.async.on_stale=drop"])
    dumped = cfg.model_dump(mode="json")
    assert dumped["grpo"]["async"] == {"max_staleness": 2, "on_stale": "drop"}
    assert "async_" not in dumped["grpo"]
    assert ItergrpoConfig.model_validate(dumped) == cfg


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["grpo.async.max_staleness=-1"], ["grpo.async.max_staleness"]),
        (["grpo.async.on_stale=skip"], ["grpo.async.on_stale", "'wait'"]),
        (
            ["grpo.async.max_staleness=1"],
            ["sampler's log-probs", "use_sampling_logprobs_as_old: true", "rollout_correction"],
        ),
        ([*ON, "grpo.algo.dynamic_sampling=true"], ["grpo.algo.dynamic_sampling: false"]),
        ([*ON, "grpo.data_source=policy_0", "grpo.preset=rft"], ["grpo.data_source: online"]),
        ([*ON, "grpo.lora.enabled=true"], ["grpo.lora.enabled: false"]),
        ([*ON, "engines.train_workers=ray"], ["engines.train_workers: none"]),
    ],
)
def test_what_async_cannot_serve_is_refused_naming_the_fix(
    overrides: list[str], names: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", overrides)
    message = str(err.value)
    assert all(name in message for name in names), message
