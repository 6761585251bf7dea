"""`grpo.preset`: a preset fills the fields nobody set, a field set beside it or after it keeps
its value (even the default), from `--set`, YAML, a `base:` chain and the Prefect form alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows.config import GRPOStageSection, ItergrpoConfig
from flows.config_files import (
    ConfigError,
    load_config,
    parameters_merged,
    stored_config_as_current,
    validate_config,
)
from flows.grpo_presets import GRPO_PRESETS
from flows.prefect_flow import iterative_rl
from grpo_core.algo.config import GRPOConfig

DAPO_WITHOUT_DYNAMIC_SAMPLING = ["grpo.preset=dapo", "grpo.algo.dynamic_sampling=false"]


def _dapo_kept_but_dynamic_sampling(cfg: ItergrpoConfig) -> None:
    algo = cfg.grpo.algo
    assert algo.dynamic_sampling is False  # set to the default, and kept
    assert (algo.eps_high, algo.loss_agg, algo.beta, algo.mask_truncated) == (
        0.28,
        "token-mean",
        0.0,
        True,
    )
    assert cfg.grpo.rewards.weight("overlong") == 1.0


def test_a_field_set_to_its_default_beside_the_preset_keeps_it() -> None:
    cfg = load_config("micro", DAPO_WITHOUT_DYNAMIC_SAMPLING)
    assert cfg.grpo.algo.dynamic_sampling is False  # the bug: the preset's True won
    _dapo_kept_but_dynamic_sampling(cfg)


def test_the_same_in_one_yaml_file_and_through_a_base_chain(tmp_path: Path) -> None:
    one_file = tmp_path / "one.yaml"
    one_file.write_text(
        "base: micro\ngrpo:\n  preset: dapo\n  algo:\n    dynamic_sampling: false\n"
    )
    dapo = tmp_path / "dapo.yaml"
    dapo.write_text("base: micro\ngrpo:\n  preset: dapo\n")
    variant = tmp_path / "variant.yaml"  # the field in a file whose base names the preset
    variant.write_text(f"base: {dapo}\ngrpo:\n  algo:\n    dynamic_sampling: false\n")
    on_top = tmp_path / "on_top.yaml"  # both in the base, another field on top
    on_top.write_text(f"base: {one_file}\ngrpo:\n  steps: 2\n")
    expected = load_config("micro", DAPO_WITHOUT_DYNAMIC_SAMPLING)
    for path in (one_file, variant, on_top):
        cfg = load_config(path)
        _dapo_kept_but_dynamic_sampling(cfg)
        assert cfg.model_copy(update={"grpo": expected.grpo}) == expected
    assert load_config(on_top).grpo.steps == 2
    assert load_config(dapo, ["grpo.algo.dynamic_sampling=false"]) == expected


def test_a_preset_fills_every_field_nobody_set() -> None:
    cfg, micro = load_config("micro", ["grpo.preset=dapo"]), load_config("micro")
    algo = cfg.grpo.algo
    assert (algo.dynamic_sampling, algo.mask_truncated, algo.eps_high) == (True, True, 0.28)
    assert cfg.grpo.rewards.verifier == micro.grpo.rewards.verifier  # a field dapo leaves
    assert algo.lr == micro.grpo.algo.lr


def test_a_preset_named_after_a_file_overrides_what_the_file_set(tmp_path: Path) -> None:
    """The demo sets grpo.algo.beta: 0.04; `--set grpo.preset=sft` on it is SFT, without the
    KL term (the ablation's arms), as naming beta in the `--set` list would be."""
    assert load_config("demo").grpo.algo.beta == 0.04
    sft = load_config("demo", ["grpo.preset=sft"]).grpo
    assert (sft.data_source, sft.algo.adv_estimator, sft.algo.beta) == ("gold", "sft", 0.0)
    kl = load_config("demo", ["grpo.preset=sft", "grpo.algo.beta=0.04"]).grpo
    assert kl.algo.beta == 0.04
    variant = tmp_path / "sft.yaml"  # a file on a base: the same
    variant.write_text("base: demo\ngrpo:\n  preset: sft\n")
    assert load_config(variant) == load_config("demo", ["grpo.preset=sft"])


def test_a_later_preset_replaces_an_earlier_one_whole(tmp_path: Path) -> None:
    dapo = tmp_path / "dapo.yaml"
    dapo.write_text("base: micro\ngrpo:\n  preset: dapo\n")
    assert load_config(dapo, ["grpo.preset=sft"]) == load_config("micro", ["grpo.preset=sft"])


def test_an_unknown_preset_is_one_line_listing_the_choices() -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", ["grpo.preset=a2c"])
    (line,) = [ln for ln in str(err.value).splitlines() if "grpo.preset" in ln]
    assert "unknown GRPO preset 'a2c'" in line
    for name in GRPO_PRESETS:
        assert f"'{name}'" in line
    assert load_config("micro", ["grpo.preset=''"]).grpo.preset is None  # a cleared form field


def test_a_section_given_as_a_model_counts_the_fields_set_on_it() -> None:
    section = GRPOStageSection.model_validate(
        {"preset": "dapo", "algo": GRPOConfig(dynamic_sampling=False, lr=1e-5)}
    )
    assert (section.algo.dynamic_sampling, section.algo.lr, section.algo.eps_high) == (
        False,
        1e-5,
        0.28,
    )


def test_the_presets_of_the_update_variants() -> None:
    def algo(name: str) -> GRPOConfig:
        return GRPOStageSection(preset=name).algo

    assert algo("paper") == GRPOConfig()  # the paper's update is the default
    dr = algo("dr_grpo")
    assert (dr.adv_estimator, dr.loss_agg) == ("dr_grpo", "seq-mean-token-sum-norm")
    ppo = algo("ppo")  # the KL penalty moves from the loss to the reward
    assert (ppo.adv_estimator, ppo.beta, ppo.loss_agg) == ("ppo", 0.0, "token-mean")
    assert GRPO_PRESETS.names() == [
        *("paper", "dr_grpo", "dapo", "ppo"),
        *("sft", "rft", "online_rft", "grpo_os", "grpo_ps"),
        *("dpo", "offline_dpo"),
    ]
    dpo = algo("dpo")  # pi_ref sits in DPO's loss: no KL term besides
    assert (dpo.adv_estimator, dpo.beta, dpo.loss_reads_reference) == ("dpo", 0.0, True)


def test_a_stored_preset_run_resumes_as_it_started() -> None:
    """The stored config holds the preset expanded: it reloads to the same config."""
    current = load_config("micro", DAPO_WITHOUT_DYNAMIC_SAMPLING)
    stored = current.model_dump(mode="json")
    assert stored["grpo"]["preset"] == "dapo"
    assert stored["grpo"]["algo"]["dynamic_sampling"] is False
    assert validate_config(stored) == current
    assert stored_config_as_current(stored, current) == stored


def _served() -> dict[str, Any]:
    return load_config("micro").model_dump(mode="json")


def _as_prefect_validates(config: dict[str, Any]) -> ItergrpoConfig:
    given: ItergrpoConfig = iterative_rl.validate_parameters({"config": config})["config"]
    return given


def test_a_preset_chosen_in_the_form_fills_the_fields_left_as_shown() -> None:
    """The Prefect form sends every field, filled in with the served config: the fields
    changed there are the ones set, so a preset chosen there sets the others it names."""
    form = _served()
    form["grpo"]["preset"] = "dapo"
    cfg = parameters_merged(_served(), _as_prefect_validates(form))
    assert (cfg.grpo.algo.dynamic_sampling, cfg.grpo.algo.eps_high) == (True, 0.28)
    form["grpo"]["algo"]["eps_high"] = 0.25
    assert parameters_merged(_served(), _as_prefect_validates(form)).grpo.algo.eps_high == 0.25


def test_partial_parameters_with_a_preset_keep_a_field_set_to_its_default() -> None:
    given = _as_prefect_validates({"grpo": {"preset": "dapo", "algo": {"dynamic_sampling": False}}})
    cfg = parameters_merged(_served(), given)
    _dapo_kept_but_dynamic_sampling(cfg)
    assert cfg == load_config("micro", DAPO_WITHOUT_DYNAMIC_SAMPLING)


def test_offline_dpo_reads_its_pairs_file_in_groups_of_two(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    cfg = load_config("micro", ["grpo.preset=offline_dpo", f"grpo.pairs_file={pairs}"])
    grpo = cfg.grpo
    assert (grpo.data_source, grpo.group_size, grpo.algo.adv_estimator) == (
        "pairs_file",
        2,
        "dpo_file",
    )
    with pytest.raises(ConfigError, match=r"set grpo\.pairs_file: PATH"):
        load_config("micro", ["grpo.preset=offline_dpo"])
    with pytest.raises(ConfigError, match=r"set grpo\.group_size: 2"):
        load_config(
            "micro", ["grpo.preset=offline_dpo", f"grpo.pairs_file={pairs}", "grpo.group_size=4"]
        )
    with pytest.raises(
        ConfigError, match=r"grpo\.pairs_file is read with data_source pairs_file only"
    ):
        load_config("micro", ["grpo.preset=dpo", f"grpo.pairs_file={pairs}"])
    with pytest.raises(ConfigError, match="trains on data_source pairs_file, not online"):
        load_config("micro", ["grpo.algo.adv_estimator=dpo_file", "grpo.algo.beta=0"])
