"""What `itergrpo serve` does with a flow run: Prefect pickles the flow object and runs it in a
spawned process, where it validates the submitted parameters (the UI form's JSON)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import cloudpickle

from flows.config import ItergrpoConfig
from flows.prefect_flow import iterative_rl
from tests.flow_helpers import micro_config


def validate_in_fresh_process(pickled_flow: bytes, parameters: dict[str, object]) -> str:
    flow = cloudpickle.loads(pickled_flow)
    try:
        validated = flow.validate_parameters(parameters)
    except Exception as err:  # as text: pydantic's errors do not all pickle back
        return f"{type(err).__name__}: {err}"
    return type(validated["config"]).__name__


def test_served_flow_validates_the_form_parameters_in_a_spawned_process(tmp_path: Path) -> None:
    # A string annotation ("ItergrpoConfig") left the parameter model undefined there:
    # every run submitted from the UI failed before its first stage.
    assert iterative_rl.fn.__annotations__["config"] is ItergrpoConfig
    form = {"config": micro_config(tmp_path, "ui-1").model_dump(mode="json")}
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        job = pool.apply_async(validate_in_fresh_process, (cloudpickle.dumps(iterative_rl), form))
        name = job.get(timeout=300)
    assert name == "ItergrpoConfig"
