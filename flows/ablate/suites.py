"""Ablation suites as data (configs/ablate/<name>.yaml) and the plan they expand to: one shared
policy_0 (the warm start, computed once) and one ordinary run per arm and seed.

An arm is a list of `--set` style overrides on the suite's base config, so an arm is exactly
what `itergrpo run --config BASE --set ...` would run. Every arm-seed run starts from the
shared policy_0: its config loads that checkpoint (`policy.kind: local`) instead of warm-
starting, and its warm_start stage evaluates it with the run's own seed (computed once per
seed where the arms' differences allow: flows/fork.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from flows.config import ItergrpoConfig
from flows.config_files import CONFIG_DIR, load_config, parse_override
from flows.errors import ConfigError
from flows.names import POLICY
from storage.checkpoints import checkpoint_path
from storage.layout import validate_run_id

SUITE_DIR = CONFIG_DIR / "ablate"
# What every arm must share with the policy_0 they start from: an arm may not override these.
SHARED_PREFIXES = ("policy.", "warm_start.", "task.", "store.", "run.seed", "run.run_id")
SHARED_KEYS = ("run.warm_start",)
_ARM_NAME = re.compile(r"^[A-Za-z0-9_]{1,40}$")


class Suite(BaseModel):
    """Arms x seeds on one base config (a preset name or YAML path)."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field("", description="What the suite measures (shown in the report).")
    config: str = Field(description="Preset (configs/NAME.yaml) or YAML path of every arm.")
    seeds: int = Field(3, ge=1, le=100, description="Seeds per arm (1 to 100; >= 2 for a CI).")
    overrides: list[str] = Field(
        default_factory=list, description="`a.b=value` overrides of every arm and of policy_0."
    )
    arms: dict[str, list[str]] = Field(
        description="Arm name -> its own `a.b=value` overrides, applied after `overrides`."
    )

    @field_validator("arms")
    @classmethod
    def _arms_are_usable(cls, arms: dict[str, list[str]]) -> dict[str, list[str]]:
        if not arms:
            raise ValueError("a suite needs at least one arm")
        for name, overrides in arms.items():
            if not _ARM_NAME.match(name):
                raise ValueError(
                    f"arm name {name!r}: use 1-40 letters, digits or '_' (it is part of run ids)"
                )
            for item in overrides:
                key = parse_override(item)[0]
                if key.startswith(SHARED_PREFIXES) or key in SHARED_KEYS:
                    raise ValueError(
                        f"arm {name!r} overrides {key}: every arm starts from the shared "
                        "policy_0, so task, policy, warm start, seed and store are the suite's; "
                        "move it to the suite's `overrides`"
                    )
        return arms


def suite_names() -> list[str]:
    """The suites `--suite NAME` accepts (configs/ablate/*.yaml)."""
    return sorted(p.stem for p in SUITE_DIR.glob("*.yaml"))


def load_suite(name: str) -> tuple[str, Suite]:
    """(suite name, suite) from configs/ablate/<name>.yaml or a YAML path."""
    path = Path(name)
    if not path.is_file():
        path = SUITE_DIR / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(
                f"--suite {name}: unknown suite; suites: {', '.join(suite_names())} "
                "(configs/ablate/*.yaml), or give the path of a suite YAML file"
            )
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}); fix the file") from None
    return path.stem, suite_from_tree(tree, str(path))


def suite_from_tree(tree: Any, where: str) -> Suite:
    """Validate a suite mapping; errors name the field (`arms.rft: ...`) and the file."""
    try:
        return Suite.model_validate(tree)
    except ValidationError as exc:
        lines = [
            f"  {'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise ConfigError(f"{where}: invalid suite:\n" + "\n".join(lines)) from None


@dataclass(frozen=True)
class ArmRun:
    """One arm at one seed: an ordinary run of the store."""

    arm: str
    seed: int
    config: ItergrpoConfig

    @property
    def run_id(self) -> str:
        assert self.config.run.run_id is not None
        return self.config.run.run_id


@dataclass(frozen=True)
class AblationPlan:
    """The runs of one ablation: the shared policy_0 (the ablation's own run) and arm x seed."""

    ablation_id: str
    suite_name: str
    suite: Suite
    seeds: int
    store_root: Path
    stored: bool = False  # the suite was read back from the store: migrate renamed fields
    # Start an arm-seed run from what another of the same seed committed (flows/fork.py). Not
    # part of the record: a forked run equals a computed one, so it may change on resume.
    fork: bool = True

    def record(self) -> dict[str, Any]:
        """What the ablation's own run stores as its config (and resume rebuilds it from)."""
        return {
            "ablation": {
                "suite": self.suite_name,
                "seeds": self.seeds,
                "spec": self.suite.model_dump(mode="json"),
            },
            "policy_0": self.policy_0_config().model_dump(mode="json"),
        }

    def _load(self, overrides: list[str]) -> ItergrpoConfig:
        return load_config(
            self.suite.config,
            [*self.suite.overrides, *overrides, f"store.root={self.store_root}"],
            migrate=self.stored,
        )

    def policy_0_config(self) -> ItergrpoConfig:
        """The warm start every arm starts from: the base config at its own seed."""
        return self._load([f"run.run_id={self.ablation_id}"])

    def seed_values(self) -> list[int]:
        """run.seed of the arm runs: the base config's seed, then the next ones."""
        base = self.policy_0_config().run.seed
        return [base + i for i in range(self.seeds)]

    def policy_0_dir(self) -> Path:
        cfg = self.policy_0_config()
        return checkpoint_path(cfg.store.resolved_root(), self.ablation_id, POLICY, 0)

    def arm_runs(self) -> list[ArmRun]:
        """Arm-major: every seed of the first arm, then the next arm (the order they run)."""
        start = [
            "policy.kind=local",
            f"policy.path={self.policy_0_dir()}",
            "run.warm_start=false",
        ]
        runs = []
        for arm, overrides in self.suite.arms.items():
            for seed in self.seed_values():
                run_id = validate_run_id(f"{self.ablation_id}-{arm}-s{seed}")
                try:
                    cfg = self._load(
                        [*overrides, *start, f"run.seed={seed}", f"run.run_id={run_id}"]
                    )
                except ConfigError as exc:
                    raise ConfigError(f"suite {self.suite_name!r}, arm {arm!r}: {exc}") from None
                runs.append(ArmRun(arm, seed, cfg))
        return runs


def make_plan(
    suite_name: str, suite: Suite, *, seeds: int | None, ablation_id: str | None, store_root: Path
) -> AblationPlan:
    """The plan of `itergrpo ablate`; every arm's config is loaded (and so checked) here."""
    if seeds is not None and seeds < 1:
        raise ConfigError(
            f"--seeds must be >= 1 (got {seeds}): every arm needs a seed, and 2 or more give a "
            "confidence interval (the paper's orderings are judged on 3 or more)"
        )
    ablation_id = validate_run_id(ablation_id or f"ablate-{suite_name}")
    plan = AblationPlan(ablation_id, suite_name, suite, seeds or suite.seeds, store_root)
    plan.arm_runs()  # a bad override fails now, naming the arm, before anything runs
    return plan
