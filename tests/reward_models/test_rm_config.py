"""reward_models.orm / prm: each RM's source, format, tokens and train flag, checked when the
config loads (torch-free), with errors naming the field and the fix."""

from __future__ import annotations

import pytest

from flows.config_files import load_config
from flows.errors import ConfigError
from reward_models.config import RewardModelConfig, RewardModelSettings, RMKind
from reward_models.formats import RM_FORMATS


def test_the_formats_are_registered_with_their_token_defaults() -> None:
    assert RM_FORMATS.names() == ["scalar_head", "classifier", "step_tag", "two_class"]
    assert RewardModelSettings(source="/m", format="step_tag").tokens == {
        "tag": " ки",
        "good": "+",
        "bad": "-",
    }
    two = RewardModelSettings(source="/m", format="two_class", tokens={"separator": "<sep>"})
    assert two.tokens == {"separator": "<sep>"}
    assert RewardModelSettings().tokens == {}  # scalar_head reads no tokens
    assert RM_FORMATS["step_tag"].marker == "tag"
    assert RM_FORMATS["step_tag"].read_tokens == ("good", "bad")


def test_the_defaults_are_todays_built_in_rms_from_the_policy() -> None:
    rms = load_config("micro").reward_models
    for kind in ("orm", "prm"):
        settings = rms.settings(kind)  # type: ignore[arg-type]
        assert (settings.source, settings.format, settings.train) == ("policy", "scalar_head", True)
    assert load_config("demo").reward_models.prm.source == "orm"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["reward_models.orm.format=nope"], "unknown reward-model format 'nope'"),
        (
            [
                "reward_models.prm.format=two_class",
                "reward_models.prm.source=/m",
                "reward_models.prm.tokens.good=+",
            ],
            r"reward_models\.prm: .*tokens\.good is not a setting of format two_class, which "
            r"reads \['separator'\]",
        ),
        (
            [
                "reward_models.orm.format=step_tag",
                "reward_models.orm.source=/m",
                "reward_models.orm.tokens.tag='ки '",
            ],
            r"tokens\.tag = 'ки ' ends in whitespace",
        ),
        (
            ["reward_models.orm.format=classifier"],
            r"reward_models\.orm\.format classifier reads a pretrained checkpoint's own head",
        ),
        (["reward_models.orm.source=orm"], "the ORM cannot start from itself"),
        (["reward_models.orm.train=false"], r"reward_models\.orm\.train is false, but format"),
        (
            [
                "reward_models.prm.source=orm",
                "reward_models.orm.format=step_tag",
                "reward_models.orm.source=/m",
            ],
            r"prm\.source is 'orm', so the PRM is the ORM's network, a step_tag",
        ),
        (["reward_models.orm.source=' '"], "source is empty"),
        (["reward_models.orm.objective=listwise"], "unknown reward-model objective 'listwise'"),
        (
            ["reward_models.prm.objective=pairwise"],
            r"reward_models\.prm\.objective is pairwise, which trains ORMs only: set "
            r"reward_models\.prm\.objective: pointwise",
        ),
        (
            [
                "reward_models.orm.format=classifier",
                "reward_models.orm.source=/m",
                "reward_models.orm.train=false",
                "reward_models.orm.objective=pairwise",
            ],
            r"orm\.objective is pairwise but reward_models\.orm\.train is false",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_field(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("micro", overrides)


def test_the_objective_is_pointwise_unless_the_orm_is_set_pairwise() -> None:
    rms = load_config("micro").reward_models
    assert (rms.orm.objective, rms.prm.objective) == ("pointwise", "pointwise")
    pairwise = load_config("demo", ["reward_models.orm.objective=pairwise"]).reward_models
    # the demo's PRM starts from the ORM's network and still learns its steps pointwise
    assert (pairwise.orm.objective, pairwise.prm.objective) == ("pairwise", "pointwise")


def test_an_unused_rms_settings_are_not_checked() -> None:
    # The ablation arms turn the PRM off under a base whose PRM starts from the ORM.
    off = ["reward_models.use_orm=false", "grpo.rewards.orm=0", "grpo.rewards.verifier=1"]
    cfg = load_config("demo", [*off, "reward_models.use_prm=false"])
    assert cfg.reward_models.prm.source == "orm"
    load_config("micro", [*off, "reward_models.orm.format=classifier"])


def test_frozen_pretrained_rms_and_a_prm_continuing_a_frozen_orm_load() -> None:
    cfg = load_config(
        "micro",
        [
            *("reward_models.orm.source=/m", "reward_models.orm.format=two_class"),
            *("reward_models.orm.train=false", "reward_models.prm.source=orm"),
            "reward_models.prm.format=two_class",
        ],
    )
    assert not cfg.reward_models.orm.train and cfg.reward_models.prm.train
    # the step-tag format may start from the policy: its LM head reads the tokens
    load_config("micro", ["reward_models.prm.format=step_tag"])


@pytest.mark.parametrize(
    ("fields", "orm", "prm"),
    [
        # (ORM from source, ORM continued), (PRM from source, PRM continued)
        ({"epochs": 3}, (3, 3), (3, 3)),
        ({"epochs": 3, "continual_epochs": 1}, (3, 1), (3, 1)),
        ({"epochs": 3, "continual_epochs": 1, "prm_epochs": 10}, (3, 1), (10, 10)),
        (
            {"epochs": 3, "continual_epochs": 1, "prm_epochs": 10, "prm_continual_epochs": 4},
            (3, 1),
            (10, 4),
        ),
        ({"epochs": 3, "continual_epochs": 1, "prm_continual_epochs": 2}, (3, 1), (3, 2)),
    ],
)
def test_each_reward_model_trains_its_own_passes_from_source_and_when_continued(
    fields: dict[str, int], orm: tuple[int, int], prm: tuple[int, int]
) -> None:
    cfg = RewardModelConfig.model_validate(fields)
    kinds: tuple[tuple[RMKind, tuple[int, int]], ...] = (("orm", orm), ("prm", prm))
    for kind, (first, later) in kinds:
        assert cfg.epochs_of(kind, continued=False) == first, kind
        assert cfg.epochs_of(kind, continued=True) == later, kind
