"""Tasks: seeded problems with gold answers, answer checking and exact step labels."""

from grpo_core.data.tasks.base import Problem, Split, Task
from grpo_core.data.tasks.registry import TaskConfig, make_task

__all__ = ["Problem", "Split", "Task", "TaskConfig", "make_task"]
