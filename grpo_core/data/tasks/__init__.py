"""Tasks: seeded problems with gold answers, answer checking and exact step labels, registered
by name (base.py holds the contract and the registry). The built-in ones register here, in the
order task.name offers them. A new task is one module defining its settings, builder and
TaskSpec, plus its line in BUILT_IN below (or a call to register_task from the user's own code,
before the config is read); docs/extending.md shows one."""

from typing import Any

from grpo_core.data.tasks import arith, code_functions, local_files, math_style, reasoning_gym
from grpo_core.data.tasks.base import (
    TASKS,
    Problem,
    Split,
    Task,
    TaskCommon,
    TaskSpec,
    register_task,
)

BUILT_IN: tuple[TaskSpec[Any], ...] = (
    arith.TASK,
    math_style.TASK,
    reasoning_gym.TASK,
    code_functions.TASK,
    local_files.TASK,
)
for _task in BUILT_IN:
    register_task(_task)

# After the built-in tasks: the config's task section is read from the registry.
from grpo_core.data.tasks.registry import TaskConfig, TaskConfigBase, make_task  # noqa: E402

__all__ = [
    "TASKS",
    "Problem",
    "Split",
    "Task",
    "TaskCommon",
    "TaskConfig",
    "TaskConfigBase",
    "TaskSpec",
    "make_task",
    "register_task",
]
