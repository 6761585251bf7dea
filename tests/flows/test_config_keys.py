"""Config keys and values as users type them: an unknown key names the fields it may have
meant, and YAML 1.1's bare off/no/yes reach a text field as the text typed (the guards'
`off`), a boolean field as the boolean."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config_files import ConfigError, load_config, parse_override


@pytest.mark.parametrize(
    ("override", "where", "hint"),
    [
        # lr's description says it in words: "Policy learning rate (AdamW)"
        ("grpo.algo.lerning_rate=1e-5", "grpo.algo.lerning_rate", "did you mean grpo.algo.lr?"),
        ("grpo.stepz=3", "grpo.stepz", "did you mean grpo.steps?"),
        ("guards.rm_aucroc=warn", "guards.rm_aucroc", "did you mean guards.rm_auroc or "),
        ("rolout.prompts=8", "rolout", "did you mean rollout?"),  # a section
    ],
)
def test_an_unknown_key_names_the_field_it_may_have_meant(
    override: str, where: str, hint: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", [override])
    line = next(line for line in str(err.value).splitlines() if line.startswith(f"  {where}:"))
    assert line.startswith(f"  {where}: Extra inputs are not permitted; {hint}")


def test_an_unknown_key_in_a_yaml_file_names_the_field_it_may_have_meant(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("base: micro\nreward_models:\n  epocs: 3\n")
    with pytest.raises(ConfigError, match=r"reward_models\.epocs: .*did you mean reward_models\."):
        load_config(path)


def test_a_key_like_no_field_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", ["grpo.algo.zzzz=1"])
    assert "did you mean" not in str(err.value)


@pytest.mark.parametrize("guard", ["rm_labels", "rm_auroc", "over_optimisation", "equal_rewards"])
def test_off_on_the_command_line_is_the_guard_action_the_docs_name(guard: str) -> None:
    assert parse_override(f"guards.{guard}=off") == (f"guards.{guard}", "off")
    assert getattr(load_config("micro", [f"guards.{guard}=off"]).guards, guard) == "off"


def test_off_in_a_yaml_file_is_the_guard_action_too(tmp_path: Path) -> None:
    path = tmp_path / "guards.yaml"
    path.write_text("base: micro\nguards:\n  rm_auroc: off\n  over_optimisation: off\n")
    cfg = load_config(path)
    assert (cfg.guards.rm_auroc, cfg.guards.over_optimisation) == ("off", "off")


def test_yaml_1_1_words_stay_booleans_where_a_field_takes_one() -> None:
    assert parse_override("run.warm_start=off") == ("run.warm_start", False)
    assert parse_override("run.warm_start=yes") == ("run.warm_start", True)
    assert parse_override("grpo.algo.dynamic_sampling=no") == ("grpo.algo.dynamic_sampling", False)
    # a boolean or a folder: off is still off, not a folder named "off"
    assert parse_override("tracking.tensorboard=off") == ("tracking.tensorboard", False)
    # keys outside the typed tree keep YAML 1.1's reading, as before
    assert parse_override("x.y=on") == ("x.y", True)
    cfg = load_config("micro", ["run.warm_start=no", "tracking.tensorboard=off"])
    assert cfg.run.warm_start is False and cfg.tracking.tensorboard is False


def test_a_name_field_takes_the_word_as_typed() -> None:
    assert parse_override("run.run_id=yes") == ("run.run_id", "yes")
    assert load_config("micro", ["run.run_id=no"]).run.run_id == "no"
