"""The task section of the config, read from the task registry (base.py's TASKS), and
`make_task`, which builds the task it names: `task: {name: arith, arith: {min_steps: 3}}`.

TaskConfig, built below, has the knobs every task reads and a section per task registered
when this module loads (so the Prefect form and docs/configuration.md show them); a task
registered later is given its section as an extra field, checked against its settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.data.tasks.base import TASKS, Task, TaskCommon, TaskSpec
from grpo_core.data.tasks.data_formats import AUTO, with_auto


def _own_formats() -> str:
    """Which answer format each task's `auto` means, for answer_format's description."""
    by_data = "its data format's (gsm8k data: gsm8k, math: boxed)"
    return "; ".join(f"{name}: {spec.answer_format or by_data}" for name, spec in TASKS.items())


class TaskConfigBase(BaseModel):
    """Which task to train and evaluate on; each task's own knobs are its section,
    task.<name> (task.arith.min_steps). The flat keys of earlier versions (task.min_steps,
    task.rg_task, task.path, ...) still load, into the section of the task they belong to."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    name: str = Field(
        default="arith",
        description="; ".join(f"{name}: {spec.summary}" for name, spec in TASKS.items()) + ".",
        json_schema_extra=TASKS.json_schema,
    )
    test_fraction: float = Field(
        default=0.2,
        gt=0.0,
        lt=1.0,
        description="Share of all questions held out as test, by hash (0-1).",
    )
    answer_format: str = Field(
        default=AUTO,
        description="How outputs state their final answer and how it is judged "
        "(grpo_core/data/answer_formats.py): 'gsm8k' (a last line '#### <answer>', compared as "
        "numbers) or 'boxed' (the last \\boxed{...}, compared by math-verify: 1/2 = 0.5 = "
        f"\\frac12). auto: the task's own ({_own_formats()}).",
        json_schema_extra=with_auto(ANSWER_FORMATS.names),
    )

    @model_validator(mode="before")
    @classmethod
    def _earlier_keys_into_sections(cls, data: Any) -> Any:
        return with_task_sections(data) if isinstance(data, Mapping) else data

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        return TASKS.check(name)

    @field_validator("answer_format")
    @classmethod
    def _known_format(cls, name: str) -> str:
        return name if name == AUTO else ANSWER_FORMATS.check(name)

    @model_validator(mode="after")
    def _check(self) -> TaskConfigBase:
        self._check_later_sections()
        spec = TASKS[self.name]
        section = self.section()
        for field in spec.needs:
            if getattr(section, field) is None:
                raise ValueError(
                    f"task.{spec.name}.{field} is required when task.name is {spec.name!r}: "
                    f"set it (--set task.{spec.name}.{field}=...)"
                )
        own = spec.answer_format
        if own is not None and self.answer_format not in (AUTO, own):
            either = [name for name, other in TASKS.items() if other.answer_format is None]
            raise ValueError(
                f"task {spec.name} states answers in the {own!r} format "
                f"({ANSWER_FORMATS[own].description}): set task.answer_format: auto or {own} "
                f"(got {self.answer_format!r}); {', '.join(either)} reads either format"
            )
        return self

    def _check_later_sections(self) -> None:
        """Extra fields are the sections of tasks registered after this class was built: each
        checked against its task's settings (a registered task without one gets defaults)."""
        extra = self.model_extra if self.model_extra is not None else {}
        for key, value in extra.items():
            if key not in TASKS:
                shared = ", ".join(TaskConfigBase.model_fields)
                raise ValueError(
                    f"task has no field {key!r}: it has {shared} and a section per task for its "
                    f"own knobs, task.<name> ({', '.join(TASKS.names())})"
                )
            try:
                extra[key] = TASKS[key].settings.model_validate(value)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in (key, *first["loc"]))
                raise ValueError(f"task.{where}: {first['msg']}") from None
        for name, spec in TASKS.items():
            if name not in type(self).model_fields and name not in extra:
                extra[name] = spec.settings()

    def section(self, name: str | None = None) -> BaseModel:
        """The settings of task `name` (default: the chosen one), task.<name>."""
        section: BaseModel = getattr(self, name or self.name)
        return section

    @property
    def common(self) -> TaskCommon:
        return TaskCommon(self.test_fraction, self.answer_format)


def with_task_sections(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task section with the flat keys of earlier versions (task.min_steps, task.rg_task,
    task.path, ...) moved into the section of the task that reads them (task.arith.min_steps,
    task.reasoning_gym.dataset, task.local_files.path), and values earlier versions named
    otherwise renamed (task.local_files.on_bad_rows: skip -> drop). A flat key wins over the
    section's own value, as `--set task.min_steps=3` on a preset that states
    task.arith.min_steps means."""
    out = dict(task)
    for _, spec in TASKS.items():
        out = _renamed_values(_moved(out, spec), spec)
    return out


def _renamed_values(task: dict[str, Any], spec: TaskSpec[Any]) -> dict[str, Any]:
    section = task.get(spec.name)
    if not spec.earlier_values or not isinstance(section, Mapping):
        return task
    renamed = {
        key: spec.earlier_values.get(key, {}).get(value, value) if isinstance(value, str) else value
        for key, value in section.items()
    }
    return {**task, spec.name: renamed}


def _moved(task: dict[str, Any], spec: TaskSpec[Any]) -> dict[str, Any]:
    flat = {old: task.pop(old) for old in list(spec.earlier_keys) if old in task}
    if not flat:
        return task
    section = task.get(spec.name)
    if isinstance(section, BaseModel):
        section = section.model_dump(exclude_unset=True)
    moved = dict(section) if isinstance(section, Mapping) else {}
    for old, value in flat.items():
        new = spec.earlier_keys[old]
        before = moved.get(new)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            value = {**before, **value}  # task.columns.question onto the section's columns
        moved[new] = value
    return {**task, spec.name: moved}


def _task_config_model() -> type[TaskConfigBase]:
    """TaskConfig with a section per task registered now."""
    sections: dict[str, Any] = {
        name: (
            spec.settings,
            Field(
                default_factory=spec.settings,
                description=f"The {name} task's own knobs (read when task.name is {name}).",
            ),
        )
        for name, spec in TASKS.items()
    }
    return create_model(
        "TaskConfig", __base__=TaskConfigBase, __doc__=TaskConfigBase.__doc__, **sections
    )


if TYPE_CHECKING:
    TaskConfig = TaskConfigBase
else:
    TaskConfig = _task_config_model()


def make_task(cfg: TaskConfigBase) -> Task:
    """The task `cfg` names, built by its registered builder from its section."""
    spec = TASKS[cfg.name]
    return spec.build(cfg.section(), cfg.common)
