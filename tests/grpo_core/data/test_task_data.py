"""Load-time validation of local GSM8K-format files: every bad row is named by file and line."""

import gzip
import json
import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from grpo_core.data.tasks import TaskConfig, make_task
from grpo_core.data.tasks.base import Task, TaskDataError
from grpo_core.data.tasks.local_files import load_rows

GOOD = [
    {"question": f"Sam has {i} pens and buys 3. How many?", "answer": f"#### {i + 3}"}
    for i in range(10)
]


def good_lines() -> list[bytes]:
    return [json.dumps(row).encode() for row in GOOD]


def build(tmp_path: Path, on_bad_rows: str = "refuse", name: str = "data.jsonl") -> Task:
    section = {"path": str(tmp_path / name), "on_bad_rows": on_bad_rows}
    cfg = TaskConfig(name="local_files", local_files=section)
    return make_task(cfg)


def all_questions(task: Task) -> set[str]:
    return {p.question for split in ("train", "test") for p in task.problems(split, 100, 0)}


BAD_LINE_7 = {
    "missing answer": (b'{"question": "What is 2+2?"}', "missing 'answer'"),
    "null answer": (b'{"question": "What is 2+2?", "answer": null}', "'answer' is null"),
    "number answer": (b'{"question": "What is 2+2?", "answer": 4}', "'answer' must be a string"),
    "missing question": (b'{"answer": "#### 4"}', "missing 'question'"),
    "empty question": (b'{"question": "   ", "answer": "#### 4"}', "'question' is empty"),
    "no ####": (b'{"question": "What is 2+2?", "answer": "It is 4."}', "no '#### <answer>'"),
    "nothing after ####": (b'{"question": "What is 2+2?", "answer": "4\\n#### "}', "nothing after"),
    "non-numeric gold": (
        b'{"question": "What is 2+2?", "answer": "#### 42 apples"}',
        "must be a number (got '42 apples')",
    ),
    "invalid JSON": (b'{"question": "What is 2+2?", "answer": ', "invalid JSON"),
    "non-UTF-8": (b'{"question": "caf\xe9 2+2?", "answer": "#### 4"}', "not valid UTF-8"),
    "not an object": (b'["What is 2+2?", "#### 4"]', "not a JSON object (got array)"),
    "conflicting duplicate": (
        json.dumps({"question": GOOD[2]["question"] + "  ", "answer": "#### 99"}).encode(),
        "different gold answers",
    ),
}


@pytest.mark.parametrize(("line", "problem"), BAD_LINE_7.values(), ids=BAD_LINE_7.keys())
def test_bad_row_is_named_by_file_and_line_or_skipped(
    tmp_path: Path, line: bytes, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    lines = good_lines()
    lines.insert(6, line)  # line 7 (1-based)
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    conflict = "different gold" in problem

    with pytest.raises(TaskDataError) as err:
        build(tmp_path)
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert problem in message
    assert "on_bad_rows: drop" in message
    if conflict:  # named at the first copy, line 3, and the second copy's line
        assert f"{path}:3:" in message and "line 7" in message
    else:
        assert f"{path}:7:" in message and "\n" not in message

    with caplog.at_level(logging.WARNING, logger="grpo_core.data.tasks.local_files"):
        task = build(tmp_path, on_bad_rows="drop")
    expected = {row["question"] for row in GOOD}
    if conflict:  # both copies dropped: neither gold answer can be trusted
        expected.discard(GOOD[2]["question"])
    assert all_questions(task) == expected
    assert f"{path}:{3 if conflict else 7}:" in caplog.text


def test_gold_answers_are_normalised_numbers(tmp_path: Path) -> None:
    golds = {"#### 1,234": "1234", "#### $5.": "5", "#### -0.50": "-0.5", "x\n####  007 ": "7"}
    path = tmp_path / "data.jsonl"
    path.write_text(
        "\n".join(json.dumps({"question": f"q{i}", "answer": a}) for i, a in enumerate(golds))
    )
    rows = load_rows(path)
    assert [r.answer for r in rows] == list(golds.values())
    assert [r.source.number for r in rows] == [1, 2, 3, 4]


def test_valid_file_loads_exactly_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    # BOM, Windows line ends and blank lines are all fine.
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(good_lines()) + b"\r\n\r\n")
    task = build(tmp_path)
    assert all_questions(task) == {row["question"] for row in GOOD}
    problems = task.problems("train", 100, 0) + task.problems("test", 100, 0)
    assert len(problems) == len(GOOD)
    assert all(task.is_correct(p, f"#### {p.answer}") for p in problems)


def test_exact_duplicates_are_kept_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\n".join(good_lines() + good_lines()[:3]))
    with caplog.at_level(logging.INFO, logger="grpo_core.data.tasks.local_files"):
        rows = load_rows(path)
    assert [r.question for r in rows] == [row["question"] for row in GOOD]
    assert [r.source.number for r in rows] == list(range(1, 11))  # first copies kept
    assert "3 exact duplicate" in caplog.text


def test_many_bad_rows_list_the_first_five_and_the_count(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    lines = good_lines() + [b'{"question": "q", "answer": null}'] * 7
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(TaskDataError) as err:
        load_rows(path)
    message = str(err.value)
    assert message.splitlines()[0].startswith(f"{path}: 7 bad rows of 17;")
    assert [f"{path}:{n}:" in message for n in range(11, 18)] == [True] * 5 + [False] * 2
    assert "... and 2 more" in message


@pytest.mark.parametrize("content", [b"", b"\n\n", b'{"question": "q"}\n[]\n'])
def test_a_file_without_valid_rows_is_refused_even_under_skip(
    tmp_path: Path, content: bytes
) -> None:
    (tmp_path / "data.jsonl").write_bytes(content)
    with pytest.raises(TaskDataError, match="no valid rows"):
        build(tmp_path, on_bad_rows="drop")


def test_parquet_bad_rows_are_named_by_row_index(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [dict(r) for r in GOOD[:4]]
    rows[2]["answer"] = None  # type: ignore[assignment]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data.parquet")
    with pytest.raises(TaskDataError, match=r"data\.parquet row 2: 'answer' is null"):
        build(tmp_path, name="data.parquet")
    task = build(tmp_path, on_bad_rows="drop", name="data.parquet")
    assert all_questions(task) == {r["question"] for i, r in enumerate(GOOD[:4]) if i != 2}

    pq.write_table(pa.Table.from_pylist([{"question": "q"}]), tmp_path / "data.parquet")
    with pytest.raises(TaskDataError, match=r"lacks columns \['answer'\]"):
        build(tmp_path, on_bad_rows="drop", name="data.parquet")


def test_json_array_rows_are_named_by_the_line_they_start_on(tmp_path: Path) -> None:
    rows: list[object] = [dict(r) for r in GOOD[:3]]
    rows[1] = {"question": GOOD[1]["question"], "answer": "no marker"}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(rows, indent=2))  # each object spans 4 lines after '['
    with pytest.raises(TaskDataError, match=rf"{path}:6: answer has no"):
        load_rows(path)
    assert [r.source.number for r in load_rows(path, "drop")] == [2, 10]

    path.write_text('[\n  {"question": "q", "answer": "#### 1"},\n  {"question": }\n]')
    with pytest.raises(TaskDataError, match=rf"{path}:3: invalid JSON"):
        load_rows(path, "drop")  # an array cannot be read past broken JSON


def test_json_lines_in_a_json_file_and_gzip_work(tmp_path: Path) -> None:
    (tmp_path / "data.json").write_bytes(b"\n".join(good_lines()))
    assert len(load_rows(tmp_path / "data.json")) == len(GOOD)
    with gzip.open(tmp_path / "data.jsonl.gz", "wb") as f:
        f.write(b"\n".join([*good_lines()[:4], b"{oops"]))
    with pytest.raises(TaskDataError, match=r"data\.jsonl\.gz:5: invalid JSON"):
        load_rows(tmp_path / "data.jsonl.gz")
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(TaskDataError, match="not a valid gzip file"):
        load_rows(tmp_path / "broken.jsonl.gz")


def test_separate_test_file_is_checked_too(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_bytes(b"\n".join(good_lines()))
    (tmp_path / "test.jsonl").write_bytes(b'{"question": "q", "answer": "#### x"}')
    cfg = TaskConfig(
        name="local_files",
        local_files={
            "path": str(tmp_path / "train.jsonl"),
            "test_path": str(tmp_path / "test.jsonl"),
        },
    )
    with pytest.raises(TaskDataError, match=r"test\.jsonl:1: gold answer"):
        make_task(cfg)


def test_on_bad_rows_accepts_only_refuse_or_drop_and_their_earlier_names() -> None:
    assert TaskConfig().local_files.on_bad_rows == "refuse"  # type: ignore[attr-defined]
    for earlier, now in (("error", "refuse"), ("skip", "drop")):
        cfg = TaskConfig(local_files={"on_bad_rows": earlier})
        assert cfg.local_files.on_bad_rows == now  # type: ignore[attr-defined]
    with pytest.raises(ValidationError, match=r"local_files\.on_bad_rows"):
        TaskConfig(local_files={"on_bad_rows": "ignore"})
