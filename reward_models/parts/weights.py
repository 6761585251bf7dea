"""grpo.rewards: a weight (>= 0) per registered reward part and the parts' options. The rules
that combine them are in grpo_core/algo/rewards.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, cast

from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
    model_validator,
)

from reward_models.parts.base import REWARD_PARTS


class RewardWeightsBase(BaseModel):
    """A weight per reward part and the parts' options, read through weight() and options().

    RewardWeights, built below from the registry, has a field per part and option registered
    when this module loads (so the Prefect form shows them); a part registered later is given
    as an extra field with its weight and options checked against the registry."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="after")
    def _extras_are_registered_parts(self) -> RewardWeightsBase:
        for key, value in (self.model_extra or {}).items():
            annotation, default = _field_of(key)
            # annotation is a runtime value here (a part's option type), hence the cast
            adapter: TypeAdapter[Any] = TypeAdapter(
                cast(Any, Annotated)[annotation, default, AllowInfNan(False)]
            )
            try:
                self.model_extra[key] = adapter.validate_python(value)  # type: ignore[index]
            except ValidationError as exc:
                raise ValueError(f"{key}: {exc.errors()[0]['msg']} (got {value!r})") from None
        return self

    def weight(self, part: str) -> float:
        """The weight of reward part `part` (its default when not set)."""
        value = getattr(self, part, None)
        if value is None:
            value = (self.model_extra or {}).get(part, REWARD_PARTS[part].default_weight)
        return float(value)

    def weights(self) -> dict[str, float]:
        """Every registered part's weight, in summing order."""
        return {name: self.weight(name) for name in REWARD_PARTS}

    def options(self, part: str) -> dict[str, Any]:
        """The options of reward part `part` by option name (their defaults when not set)."""
        found: dict[str, Any] = {}
        spec = REWARD_PARTS[part]
        for option, (_, default) in spec.options.items():
            key = spec.option_field(option)
            value = getattr(self, key, None)
            if value is None:
                value = (self.model_extra or {}).get(key, default.default)
            found[option] = value
        return found

    @property
    def learned(self) -> float:
        """Total weight of the learned reward models' parts (ORM + PRM outcome score, ...)."""
        return sum(w for name, w in self.weights().items() if REWARD_PARTS[name].learned)


def _field_of(key: str) -> tuple[Any, Any]:
    """(annotation, pydantic Field) of grpo.rewards.<key>: a part's weight or option."""
    for name, part in REWARD_PARTS.items():
        if key == name:
            return float, Field(part.default_weight, ge=0.0, description=part.description)
        for option, (annotation, default) in part.options.items():
            if key == part.option_field(option):
                return annotation, default
    fields = [
        k
        for name, part in REWARD_PARTS.items()
        for k in (name, *map(part.option_field, part.options))
    ]
    raise ValueError(f"no reward part or option {key!r}: the fields are {fields}")


def _reward_weights_model() -> type[RewardWeightsBase]:
    """RewardWeights with a field per part (and option) registered now."""
    fields: dict[str, Any] = {}
    for name, part in REWARD_PARTS.items():
        fields[name] = _field_of(name)
        for option in part.options:
            fields[part.option_field(option)] = _field_of(part.option_field(option))
    return create_model(
        "RewardWeights", __base__=RewardWeightsBase, __doc__=RewardWeightsBase.__doc__, **fields
    )


if TYPE_CHECKING:
    RewardWeights = RewardWeightsBase
else:
    RewardWeights = _reward_weights_model()
