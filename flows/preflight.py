"""The pre-flight check: everything knowable before a run is registered, checked before
anything is written, so a refused run leaves the store exactly as it was and a corrected
rerun is not 'a different config'. (A SmolLM2 policy not yet converted is converted into its
cache, outside the store, so that its tokenizer measures every data row.)

It covers the store and run id (path, lock, a different config on an existing run) here,
then the policy and its tokenizer, the task's data and the prompts' length against the
policy's and the reward models' context (flows/preflight_data.py). Cross-field rules of the
config itself are checked when it loads (flows/config.py).
"""

from __future__ import annotations

import functools

from flows.config import ItergrpoConfig
from flows.config_files import stored_config_for_rerun
from flows.config_readers import stages_reading
from flows.data_identity import check_data, data_now
from flows.tracking.run_tracking import check_trackers
from storage.store import RunStore


def preflight(cfg: ItergrpoConfig, *, force_config: bool = False) -> None:
    """Raise (StoreError, PreflightError, TaskDataError, ...) if the run cannot start or would
    fail at a later stage for a reason knowable now; writes nothing to the store."""
    assert cfg.run.run_id is not None
    store = RunStore(cfg.store.resolved_root())
    store.check_can_open(
        cfg.run.run_id,
        cfg.model_dump(mode="json"),
        force_config=force_config,
        upgrade_config=functools.partial(stored_config_for_rerun, current=cfg),
        stage_readers=stages_reading,
    )
    # The data the committed stages read, unchanged (a record of it is written at the start).
    check_data(store, cfg.run.run_id, data_now(cfg), force=force_config)
    check_trackers(cfg.tracking)  # a tracker configured but not installed
    # The policy, its tokenizer and the task data need torch and transformers (seconds to
    # import): checked after the store, so a refused run (a lock, a changed config) answers
    # at once.
    from flows.preflight_data import check_policy_and_data

    check_policy_and_data(cfg)
