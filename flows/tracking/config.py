"""The `tracking` config section: where a run's metrics are also sent (MLflow, TensorBoard).
Torch- and mlflow-free: a config loads without either installed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

TRACKING_EXTRA = "pip install 'itergrpo[tracking]'"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class MLflowSettings(_Section):
    """An MLflow tracking server or store the run also logs to."""

    uri: str | None = Field(
        None,
        description="MLflow tracking URI: a server (http://127.0.0.1:5000), a database "
        "(sqlite:///mlflow.db) or a folder (file:./mlruns). Empty: no MLflow logging.",
    )
    experiment: str = Field(
        "itergrpo",
        min_length=1,
        description="MLflow experiment the run is logged under (created if missing).",
    )

    tags: dict[str, str] = Field(
        default_factory=dict,
        description="Extra tags on the MLflow run. `itergrpo ablate` sets mlflow.parentRunId "
        "(the ablation's run), arm and seed on each arm-seed run.",
    )

    @field_validator("uri", mode="before")
    @classmethod
    def _empty_is_off(cls, value: Any) -> Any:
        """The Prefect form and `--set tracking.mlflow.uri=` send '' for a cleared field."""
        return None if isinstance(value, str) and not value.strip() else value


class TrackingSection(_Section):
    """Experiment trackers the run reports to, besides its own store (both optional, combinable;
    `pip install 'itergrpo[tracking]'`). What is logged: docs/tracking.md."""

    mlflow: MLflowSettings = Field(
        default_factory=MLflowSettings,
        description="MLflow: tracking URI (empty: off) and experiment name.",
    )
    tensorboard: bool | str = Field(
        False,
        description="TensorBoard event files: true (in the run's folder of the store, "
        "runs/<run_id>/tensorboard), a log directory, or false (off).",
    )

    @field_validator("tensorboard", mode="before")
    @classmethod
    def _spelled_as_text(cls, value: Any) -> Any:
        """The Prefect form sends text: '' and 'false' are off, 'true' the default folder."""
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "false")):
            return False
        return True if isinstance(value, str) and value.strip().lower() == "true" else value

    @property
    def enabled(self) -> bool:
        """Whether any tracker is configured."""
        return self.mlflow.uri is not None or self.tensorboard is not False
