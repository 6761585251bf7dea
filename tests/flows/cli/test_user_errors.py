"""Every user error found before a run starts: exit 2, one line naming the fix, no
traceback, under Prefect as without it, and the store exactly as it was (hashed listing)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.cli import main
from flows.config_files import load_config
from grpo_core.contracts.errors import MissingPathError
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from storage.store import RunStore
from tests import rm_checkpoints

Case = Callable[[Path, Path], list[str]]  # (tmp dir, store) -> extra CLI arguments


def listing(root: Path) -> dict[str, str]:
    """Every file under `root` with the hash of its bytes (empty if `root` does not exist)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _policy_dir(tmp: Path, *, special_tokens: bool) -> Path:
    path = tmp / "policy"
    tokenizer = build_char_tokenizer()
    create_tiny_policy(
        PolicyConfig(n_layers=1, hidden_size=32, n_heads=2), tokenizer
    ).save_pretrained(path)
    if not special_tokens:
        tokenizer.pad_token, tokenizer.eos_token = None, None
    tokenizer.save_pretrained(path)
    return path


def _jsonl(tmp: Path, rows: list[str]) -> Path:
    path = tmp / "data.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def _local_task(path: Path) -> list[str]:
    return ["--set", "task.name=local_files", "--set", f"task.local_files.path={path}"]


GOOD_ROW = json.dumps({"question": "What is 1+1?", "answer": "1+1=2\n#### 2"})
ANSWERS_ONLY = [json.dumps({"problem": f"What is {i}+1?", "answer": str(i + 1)}) for i in range(20)]


def _rm(kind: str, path: Path, fmt: str | None = None, **tokens: str) -> list[str]:
    """--set arguments: the `kind` RM from the checkpoint at `path`, in format `fmt`."""
    args = ["--set", f"reward_models.{kind}.source={path}"]
    args += ["--set", f"reward_models.{kind}.format={fmt}"] if fmt else []
    for name, value in tokens.items():
        args += ["--set", f"reward_models.{kind}.tokens.{name}='{value}'"]
    return args


def _without_tokenizer(tmp: Path) -> Path:
    path = rm_checkpoints.classifier(tmp / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink()
    return path


CASES: dict[str, tuple[Case, str]] = {
    "missing policy path": (
        lambda tmp, store: ["--set", "policy.kind=local", "--set", f"policy.path={tmp / 'nope'}"],
        "is not an HF model directory (no config.json)",
    ),
    "policy dir without config.json": (
        lambda tmp, store: [
            "--set",
            "policy.kind=local",
            "--set",
            f"policy.path={tmp.joinpath('e').mkdir() or tmp / 'e'}",
        ],
        "no config.json",
    ),
    "tokenizer without pad or EOS": (
        lambda tmp, store: [
            "--set",
            "policy.kind=local",
            "--set",
            f"policy.path={_policy_dir(tmp, special_tokens=False)}",
        ],
        "neither a pad nor an EOS token",
    ),
    "missing task.local_files.path": (
        lambda tmp, store: _local_task(tmp / "missing.jsonl"),
        "missing.jsonl",
    ),
    "a data row without an answer": (
        lambda tmp, store: _local_task(_jsonl(tmp, [GOOD_ROW, json.dumps({"question": "q?"})])),
        "data.jsonl:2",
    ),
    "a split with no problems": (
        lambda tmp, store: _local_task(_jsonl(tmp, [GOOD_ROW])),
        "problems: give it more data",
    ),
    "local data without solutions, with warm start": (
        lambda tmp, store: _local_task(_jsonl(tmp, ANSWERS_ONLY)),
        "run.warm_start trains on gold solutions, but task local_files/data.jsonl problem",
    ),
    "a mapped column the data lacks": (
        lambda tmp, store: [
            *_local_task(_jsonl(tmp, ANSWERS_ONLY)),
            *("--set", "task.local_files.columns.question=prompt"),
        ],
        "task.local_files.columns.question is 'prompt', which is not a column of",
    ),
    "store is a file": (
        lambda tmp, store: ["--store", str(tmp / "file")],
        "is a file, not a directory",
    ),
    "run id with a slash": (lambda tmp, store: ["--run-id", "a/b"], "invalid run id"),
    "changed config of a run with commits": (
        lambda tmp, store: ["--run-id", "r1", "--set", "run.iterations=1"],
        "different config (differing keys: run.iterations",
    ),
    "a run another process holds": (lambda tmp, store: ["--run-id", "held"], "is locked by PID"),
    "prompt longer than the policy's context": (
        lambda tmp, store: ["--set", "policy.max_position_embeddings=16"],
        "exceeds the policy's context (max_position_embeddings) = 16",
    ),
    "prompt longer than the RMs' max_length": (
        lambda tmp, store: ["--set", "reward_models.max_length=20"],
        "exceeds reward_models.max_length = 20",
    ),
    "an RM source that is not a model directory": (
        lambda tmp, store: _rm("orm", tmp / "nope", "classifier"),
        "is not a model directory (no config.json)",
    ),
    "an RM format unlike its checkpoint's class": (
        lambda tmp, store: _rm("orm", rm_checkpoints.step_tag_lm(tmp / "lm"), "classifier"),
        "reward_models.orm.format is classifier, which reads a *ForSequenceClassification or "
        "*ForTokenClassification checkpoint, but reward_models.orm.source",
    ),
    "a classifier ORM whose head is not one logit": (
        lambda tmp, store: _rm(
            "orm", rm_checkpoints.classifier(tmp / "a", num_labels=2), "classifier"
        ),
        "has num_labels 2: set reward_models.orm.format: two_class",
    ),
    "a two-class PRM whose head is not two classes": (
        lambda tmp, store: _rm("prm", rm_checkpoints.classifier(tmp / "a"), "two_class"),
        "reward_models.prm.format is two_class, which reads a head of 2 logits",
    ),
    "a new head on a checkpoint with its own": (
        lambda tmp, store: _rm("orm", rm_checkpoints.two_class(tmp / "c")),
        "reward_models.orm.format is scalar_head, which puts a new head on a backbone",
    ),
    "a step-tag PRM whose good token is not one token": (
        lambda tmp, store: _rm("prm", rm_checkpoints.step_tag_lm(tmp / "b"), "step_tag", good="+-"),
        "reward_models.prm.tokens.good = '+-' is 2 tokens in the reward model's tokenizer",
    ),
    "a step tag the RM's tokenizer merges into the text": (
        lambda tmp, store: _rm("prm", rm_checkpoints.step_tag_lm(tmp / "b"), "step_tag", tag="2"),
        "reward_models.prm.tokens.tag = '2' is merged with the text around it",
    ),
    "an RM source without its tokenizer": (
        lambda tmp, store: _rm("orm", _without_tokenizer(tmp), "classifier"),
        "has no tokenizer that loads",
    ),
    "ks above n_samples": (lambda tmp, store: ["--set", "evaluation.ks=[16]"], "evaluation.ks"),
    "mini-batches above the batch": (
        lambda tmp, store: ["--set", "grpo.algo.mini_batches_per_epoch=999"],
        "grpo.algo.mini_batches_per_epoch (999) exceeds",
    ),
    "heads that do not divide the width": (
        lambda tmp, store: ["--set", "policy.hidden_size=30"],
        "even multiple of policy.n_heads",
    ),
    "a config file that is not YAML": (
        lambda tmp, store: ["--config", str(_write(tmp / "c.yaml", "run: [1\n"))],
        "c.yaml line 2, column 1: not valid YAML",
    ),
}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _existing_store(store: Path) -> None:
    """A store holding a committed run `r1` (micro config) and a run `held` locked by us."""
    from tests.flow_helpers import commit_a_stage

    cfg = load_config("micro", [f"store.root={store}", "run.run_id=r1"])
    commit_a_stage(RunStore(store), "r1", cfg.model_dump(mode="json"))


@pytest.mark.parametrize("prefect", [False, True], ids=["no-prefect", "prefect"])
@pytest.mark.parametrize("name", list(CASES))
def test_user_error_is_one_clean_line_and_the_store_is_untouched(
    name: str, prefect: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case, expected = CASES[name]
    store = tmp_path / "store"
    (tmp_path / "file").write_text("not a store")
    _existing_store(store)
    held = RunStore(store).open_run("held", {})  # a live holder: this process
    try:
        args = case(tmp_path, store)
        argv = ["run", "--config", "micro", "--store", str(store), *args]
        argv += [] if prefect else ["--no-prefect"]
        before = listing(store)
        code = main(argv)
        after = listing(store)
    finally:
        held.close()
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 2, text
    assert expected in text, text
    assert "Traceback" not in text
    errors = [line for line in out.err.splitlines() if "error" in line]
    assert len(errors) <= 3, out.err  # the message (a config error lists one line per field)
    assert after == before


def test_prefect_logs_a_user_error_without_its_traceback() -> None:
    import logging
    import sys

    from flows.cli.run_commands import _NoUserErrorTraceback

    def record(exc: Exception) -> logging.LogRecord:
        try:
            raise exc
        except Exception:
            info = sys.exc_info()
        return logging.LogRecord("prefect.flow_runs", logging.ERROR, "f", 1, "failed", None, info)

    user = record(MissingPathError("no such policy"))
    bugs = [record(KeyError("ratio_max")), record(ValueError("zip() argument 2 is shorter"))]
    assert all(_NoUserErrorTraceback().filter(r) for r in [user, *bugs])
    assert user.exc_info is None  # the message says it all
    assert all(r.exc_info is not None for r in bugs)  # a bug keeps its traceback, ValueError too


def test_a_bug_in_a_stage_keeps_its_traceback_in_the_terminal(
    bug_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """Only UserError is a one-line message: a ValueError raised inside a stage (what a bug in
    a zip(strict=True), pyarrow or a tokenizer raises) reaches the terminal with its traceback
    and exit status 1, not 2."""
    out, store = bug_run
    assert out.returncode == 1, out.stderr
    assert "Traceback (most recent call last)" in out.stderr
    assert "ValueError: injected by ITERGRPO_FAULT" in out.stderr
    assert "itergrpo run: error:" not in out.stderr
    assert RunStore(store).run_status("bug")["status"] == "failed"


# The warm start's first progress report: the first stage of every run.
INJECTED_BUG = "ValueError@warm_start:0:1"


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_bug_in_a_stage_keeps_its_traceback_in_the_prefect_flow_run_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from flows.interrupts import FAULT_ENV
    from tests.prefect_harness import flow_run_ids, new_flow_runs

    monkeypatch.setenv(FAULT_ENV, INJECTED_BUG)
    argv = ["run", "--config", "micro", "--store", str(tmp_path), "--run-id", "bug"]
    before = flow_run_ids()  # the server is shared: only this test's flow runs count
    with pytest.raises(ValueError, match="injected by ITERGRPO_FAULT"):
        main(argv)  # not turned into a message: the interpreter prints its traceback
    runs = new_flow_runs(before)
    with get_client(sync_client=True) as client:
        mine = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in runs]))
        logs = client.read_logs(log_filter=mine)
    assert len(runs) == 1 and runs[0].state is not None and runs[0].state.is_failed()
    failures = [entry.message for entry in logs if entry.message.startswith("Task run failed")]
    assert len(failures) == 1, [entry.message for entry in logs]
    assert "Traceback (most recent call last)" in failures[0]  # the UI shows where it broke
    assert 'warm_start_stage\n    progress(0.0, "warm start (SFT)")' in failures[0]
