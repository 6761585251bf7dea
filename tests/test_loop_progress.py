"""The run's progress line: the time left is each remaining stage at its last duration."""

from flows.loop import seconds_left


def test_time_left_is_known_once_every_remaining_stage_has_run() -> None:
    last = {"rollout": 10.0, "label": 5.0, "grpo": 30.0}
    assert seconds_left(["label", "grpo", "rollout"], last) == 45.0
    assert seconds_left([], last) == 0.0
    assert seconds_left(["grpo", "evaluate"], last) is None  # evaluate has not run yet
