"""The GRPO stage's prompt cursor: steps take prompts_per_step in order, dynamic sampling's
extra rounds the next ones, and no step draws a problem twice."""

from __future__ import annotations

from typing import Any

from flows.stages.grpo_prompts import PromptCursor, extra_round
from grpo_core.data.tasks.base import Problem


def pool(n: int) -> list[Problem]:
    return [Problem(f"p{i}", f"q{i}", str(i)) for i in range(n)]


def ids(problems: list[Problem]) -> list[str]:
    return [p.problem_id for p in problems]


def test_steps_without_extra_rounds_take_consecutive_slices() -> None:
    cursor = PromptCursor(pool(6))
    assert [ids(cursor.take(4)) for _ in range(3)] == [
        ["p0", "p1", "p2", "p3"],
        ["p4", "p5", "p0", "p1"],  # wraps round the pool, as step_prompt_indices did
        ["p2", "p3", "p4", "p5"],
    ]
    assert cursor.position == 12


def recorded_rewarder(problems: list[Problem], prompts: list[str], batch: Any) -> Any:
    return ids(problems), prompts


def test_extra_rounds_draw_the_next_prompts_and_never_one_twice_in_a_step() -> None:
    cursor = PromptCursor(pool(6))
    drawn = cursor.take(3)  # round 0: p0 p1 p2
    prompter = "Q: {}".format
    texts, reward = extra_round(cursor, drawn, prompter, recorded_rewarder, 1, 2)  # type: ignore[arg-type]
    assert texts == ["Q: q3", "Q: q4"] and ids(drawn) == ["p0", "p1", "p2", "p3", "p4"]
    assert reward(None) == (["p3", "p4"], ["Q: q3", "Q: q4"])  # the round's own problems
    # 2 more asked, 1 left in the pool before p0 would come round again
    texts, _ = extra_round(cursor, drawn, prompter, recorded_rewarder, 2, 2)  # type: ignore[arg-type]
    assert texts == ["Q: q5"] and len(set(ids(drawn))) == 6
    texts, _ = extra_round(cursor, drawn, prompter, recorded_rewarder, 3, 2)  # type: ignore[arg-type]
    assert texts == [] and cursor.position == 6  # the whole pool drawn: nothing more
