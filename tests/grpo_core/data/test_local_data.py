"""local_files on real data layouts: GSM8K and MATH files, `datasets` folders and files read
with datasets, the column mapping, the data's own splits, and every bad row named with its
place (FILE:LINE, FILE row N) and column. Each test writes its own small data."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from grpo_core.data.tasks import TaskConfig, make_task
from grpo_core.data.tasks.base import Task, TaskDataError
from grpo_core.data.tasks.data_formats import DATA_FORMATS, recognise, resolve_columns
from grpo_core.data.tasks.local_files import LocalFilesTask, load_rows

LOG = "grpo_core.data.tasks.local_files"
MATH_ROWS = [
    {
        "problem": f"Simplify {2 * i}/{4 * i}.",
        "solution": f"Divide by {2 * i}: it is $\\boxed{{\\frac{{1}}{{2}}}}$."
        if i % 2
        else f"First $\\boxed{{1}}$, then $\\boxed{{\\frac{{\\sqrt{{{i}}}}}{{{i}}}}}$.",
        "level": f"Level {i % 5 + 1}",
        "type": "Algebra",
    }
    for i in range(1, 13)
]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def local(path: Path, **fields: Any) -> Task:
    """The local_files task on `path`; `fields` of its section, or the shared test_fraction
    and answer_format."""
    shared = {k: fields.pop(k) for k in ("test_fraction", "answer_format") if k in fields}
    section = {"path": str(path), **fields}
    return make_task(TaskConfig(name="local_files", local_files=section, **shared))


def problems(task: Task, split: str = "train") -> dict[str, Any]:
    """question -> problem of one split, all of them."""
    return {p.question: p for p in task.problems(split, 10_000, seed=0)}  # type: ignore[arg-type]


def everything(task: Task) -> dict[str, Any]:
    return {**problems(task, "train"), **problems(task, "test")}


# ---- formats -----------------------------------------------------------------------------------


def test_a_gsm8k_file_is_recognised_and_judged_by_its_number(tmp_path: Path) -> None:
    worked = "{i}+2=<<{i}+2={j}>>{j}\n#### {j:,}"
    rows = [
        {"question": f"Ann has {i} pens and buys 2.", "answer": worked.format(i=i, j=i + 2)}
        for i in range(998, 1006)
    ]
    task = local(write_jsonl(tmp_path / "gsm.jsonl", rows))
    assert task.answer_format.name == "gsm8k"
    got = everything(task)
    assert {q: p.answer for q, p in got.items()} == {
        r["question"]: str(int(r["answer"].split("#### ")[1].replace(",", ""))) for r in rows
    }
    p = got["Ann has 998 pens and buys 2."]
    assert p.solution == "998+2=1000\n#### 1,000"  # calculator annotations removed
    assert task.is_correct(p, "so\n#### 1000") and not task.is_correct(p, "\\boxed{1000}")


def test_a_math_file_takes_the_last_box_of_the_solution_and_judges_latex(tmp_path: Path) -> None:
    task = local(write_jsonl(tmp_path / "math.jsonl", MATH_ROWS))
    assert task.answer_format.name == "boxed"
    got = everything(task)
    assert len(got) == len(MATH_ROWS)
    for row in MATH_ROWS:
        p = got[row["problem"]]
        i = int(row["problem"].split()[1].split("/")[0]) // 2
        # nested braces kept whole; an earlier \boxed{1} is not the answer
        assert p.answer == ("\\frac{1}{2}" if i % 2 else f"\\frac{{\\sqrt{{{i}}}}}{{{i}}}")
        assert p.solution == row["solution"]
        assert p.meta == {"level": row["level"], "type": "Algebra"}
    half = got["Simplify 2/4."]
    assert task.is_correct(half, "so \\boxed{0.5}") and task.is_correct(half, "\\boxed{2/4}")
    assert not task.is_correct(half, "#### 0.5") and not task.is_correct(half, "\\boxed{1/3}")
    root = got["Simplify 8/16."]  # gold sqrt(4)/4 = 1/2
    assert task.is_correct(root, "\\boxed{\\frac{1}{2}}")


def test_a_math_answer_column_is_the_gold_answer_where_a_row_has_one(tmp_path: Path) -> None:
    rows = [
        {"problem": "p1", "solution": "so \\boxed{2/4}", "answer": "\\frac12"},
        {"problem": "p2", "solution": "no box at all", "answer": "\\boxed{7}"},
        {"problem": "p3", "solution": "then \\boxed{\\sqrt{\\frac{1}{4}}}", "answer": None},
        {"problem": "p4", "solution": "so \\boxed{9}", "answer": "  "},
        {"problem": "p5", "answer": 12},  # no solution: a number is an answer
    ]
    task = local(write_jsonl(tmp_path / "math.jsonl", rows), test_fraction=0.01)
    got = everything(task)
    assert {q: p.answer for q, p in got.items()} == {
        "p1": "\\frac12",
        "p2": "7",
        "p3": "\\sqrt{\\frac{1}{4}}",
        "p4": "9",
        "p5": "12",
    }
    assert got["p5"].solution is None and got["p1"].solution == "so \\boxed{2/4}"


def test_bare_answers_in_a_gsm8k_layout_are_read_once_mapped_as_the_answer(
    tmp_path: Path,
) -> None:
    """GSM8K's 'answer' column is a worked solution; bare final answers there are an answer
    column, and the mapping says so."""
    rows = [{"question": f"q{i}", "answer": f"\\frac{{{i}}}{{7}}"} for i in range(1, 6)]
    path = write_jsonl(tmp_path / "bare.jsonl", rows)
    with pytest.raises(TaskDataError, match=r"(?s)bare\.jsonl: 5 bad rows.*:1: 'answer' states no"):
        local(path, answer_format="boxed")
    task = local(path, answer_format="boxed", columns={"answer": "answer"})
    assert {p.answer for p in everything(task).values()} == {r["answer"] for r in rows}
    assert task.is_correct(everything(task)["q1"], "\\boxed{1/7}")


def test_problems_and_answers_alone_are_a_math_dataset(tmp_path: Path) -> None:
    rows = [{"problem": f"q{i}", "answer": f"{i}^2"} for i in range(6)]
    task = local(write_jsonl(tmp_path / "aime.jsonl", rows))
    assert task.answer_format.name == "boxed"
    assert {p.answer for p in everything(task).values()} == {f"{i}^2" for i in range(6)}
    assert all(p.solution is None for p in everything(task).values())


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        ({"question", "answer"}, "gsm8k"),
        ({"question"}, "gsm8k"),
        ({"problem", "solution", "level", "type"}, "math"),
        ({"problem", "answer"}, "math"),
        ({"problem", "solution", "answer", "question"}, "math"),
        ({"prompt", "response"}, None),
        ({"answer"}, None),  # both formats read an 'answer': ambiguous
    ],
)
def test_auto_recognises_the_format_whose_columns_the_data_has(
    columns: set[str], expected: str | None
) -> None:
    found = recognise(columns, {})
    if expected is None:
        assert isinstance(found, str) and "set task.local_files.data_format" in found
        assert str(sorted(columns)) in found
    else:
        assert not isinstance(found, str) and found.name == expected


def test_the_mapping_counts_when_recognising_and_fills_only_the_roles_it_names() -> None:
    mapped: dict[str, str | None] = {"question": "prompt", "answer": "final"}
    found = recognise({"prompt", "final", "solution"}, mapped)
    assert not isinstance(found, str) and found.name == "math"
    columns = resolve_columns(DATA_FORMATS["math"], mapped, {"prompt", "final"})
    assert columns.named() == {"question": "prompt", "answer": "final"}  # no 'solution' column
    gsm8k = resolve_columns(DATA_FORMATS["gsm8k"], {"solution": "cot"}, {"question", "cot"})
    assert gsm8k.named() == {"question": "question", "solution": "cot"}


# ---- datasets folders and files ----------------------------------------------------------------


def test_a_saved_dataset_dict_uses_its_own_train_and_test_splits(tmp_path: Path) -> None:
    train, test = MATH_ROWS[:8], MATH_ROWS[8:]
    extra = [{**MATH_ROWS[0], "problem": "a validation question"}]
    splits = {"train": train, "test": test, "validation": extra}
    DatasetDict({k: Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(tmp_path / "d")
    task = local(tmp_path / "d", test_fraction=0.5)  # not used: the data has a test split
    assert task.answer_format.name == "boxed"
    assert set(problems(task, "train")) == {r["problem"] for r in train}
    assert set(problems(task, "test")) == {r["problem"] for r in test}
    other = write_jsonl(tmp_path / "other.jsonl", extra)  # task.local_files.test_path comes first
    task = local(tmp_path / "d", test_path=str(other))
    assert set(problems(task, "test")) == {"a validation question"}


def test_a_saved_dataset_is_hash_split_and_its_bad_rows_named_by_row(tmp_path: Path) -> None:
    rows = [dict(r) for r in MATH_ROWS]
    rows[5]["solution"] = "It is one half."
    Dataset.from_list(rows).save_to_disk(tmp_path / "d")
    with pytest.raises(TaskDataError) as err:
        local(tmp_path / "d")
    assert str(err.value).startswith(f"{tmp_path / 'd'} row 5: 'solution' states no final answer")
    assert "no answer column (task.local_files.columns.answer)" in str(err.value)
    task = local(tmp_path / "d", on_bad_rows="drop", test_fraction=0.5)
    train, test = problems(task, "train"), problems(task, "test")
    assert set(train) | set(test) == {r["problem"] for i, r in enumerate(rows) if i != 5}
    assert train and test and not set(train) & set(test)


def test_a_bad_row_of_a_saved_test_split_is_named_by_its_folder(tmp_path: Path) -> None:
    test = [dict(r) for r in MATH_ROWS[8:]]
    test[1]["problem"] = " "
    d = DatasetDict({"train": Dataset.from_list(MATH_ROWS[:8]), "test": Dataset.from_list(test)})
    d.save_to_disk(tmp_path / "d")
    where = re.escape(str(tmp_path / "d" / "test"))
    with pytest.raises(TaskDataError, match=rf"^{where} row 1: 'problem' is empty"):
        local(tmp_path / "d")


def test_a_dataset_dict_without_a_train_split_names_its_splits(tmp_path: Path) -> None:
    DatasetDict({"test": Dataset.from_list(MATH_ROWS)}).save_to_disk(tmp_path / "d")
    with pytest.raises(TaskDataError, match=r"has splits \['test'\] and no 'train' split"):
        local(tmp_path / "d")
    task = local(tmp_path / "d" / "test")  # a saved split is a Dataset folder of its own
    assert len(everything(task)) == len(MATH_ROWS)


def test_a_folder_of_data_files_is_split_by_file_name(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "train.jsonl", MATH_ROWS[:9])
    write_jsonl(tmp_path / "data" / "test.jsonl", MATH_ROWS[9:])
    task = local(tmp_path / "data")
    assert set(problems(task, "test")) == {r["problem"] for r in MATH_ROWS[9:]}
    assert len(problems(task, "train")) == 9


def test_data_datasets_cannot_read_is_a_task_data_error_naming_the_fix(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskDataError, match=r"empty: datasets cannot read it .*folder of data"):
        local(tmp_path / "empty")
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(MATH_ROWS[0]) + "\n{oops\n")
    with pytest.raises(
        TaskDataError, match=r"broken\.jsonl: datasets cannot read it \(ArrowInvalid"
    ):
        local(path, file_reader="datasets")
    with pytest.raises(TaskDataError, match=r"broken\.jsonl:2: invalid JSON"):
        local(path)  # itergrpo names the line


@pytest.mark.parametrize("suffix", ["parquet", "json", "jsonl", "csv", "arrow"])
def test_files_read_with_datasets_name_bad_rows_by_row(tmp_path: Path, suffix: str) -> None:
    rows = [dict(r) for r in MATH_ROWS]
    rows[3]["solution"] = "\\boxed{??}"
    path = tmp_path / f"math.{suffix}"
    table = pa.Table.from_pylist(rows)
    if suffix == "parquet":
        pq.write_table(table, path)
    elif suffix == "json":
        path.write_text(json.dumps(rows, indent=2))
    elif suffix == "csv":
        pa_csv.write_csv(table, path)
    elif suffix == "arrow":
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as out:
            out.write_table(table)
    else:
        write_jsonl(path, rows)
    with pytest.raises(TaskDataError) as err:
        local(path, file_reader="datasets")
    assert str(err.value).startswith(
        f"{path} row 3: gold answer '??': math-verify cannot parse it (read from 'solution')"
    )
    task = local(path, file_reader="datasets", on_bad_rows="drop")
    assert len(everything(task)) == len(rows) - 1


def test_reading_with_datasets_or_itergrpo_gives_the_same_problems(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    Dataset.from_list(MATH_ROWS).save_to_disk(tmp_path / "saved")
    ours = local(path)
    for other in (local(path, file_reader="datasets"), local(tmp_path / "saved")):
        for split in ("train", "test"):
            mine = [(p.question, p.answer, p.solution, p.meta) for p in ours.problems(split, 50, 3)]
            theirs = [
                (p.question, p.answer, p.solution, p.meta) for p in other.problems(split, 50, 3)
            ]
            assert mine == theirs


# ---- the column mapping ------------------------------------------------------------------------


def test_mapped_columns_read_a_differently_named_dataset(tmp_path: Path) -> None:
    rows = [
        {"prompt": f"What is {i} + {i}?", "response": f"{i}+{i}={2 * i}\n#### {2 * i}", "id": i}
        for i in range(8)
    ]
    columns = {"question": "prompt", "solution": "response"}
    task = local(write_jsonl(tmp_path / "mine.jsonl", rows), data_format="gsm8k", columns=columns)
    assert task.answer_format.name == "gsm8k"
    assert {q: p.answer for q, p in everything(task).items()} == {
        r["prompt"]: str(2 * r["id"]) for r in rows
    }


def test_a_struct_field_is_mapped_by_a_dotted_name(tmp_path: Path) -> None:
    """verl's parquet layout: the gold answer in reward_model.ground_truth."""
    rows = [
        {
            "extra_info": {"question": f"Halve {2 * i}.", "index": i},
            "reward_model": {"style": "rule", "ground_truth": f"{i}"},
        }
        for i in range(1, 7)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "verl.parquet")
    columns = {"question": "extra_info.question", "answer": "reward_model.ground_truth"}
    task = local(tmp_path / "verl.parquet", data_format="math", columns=columns)
    got = everything(task)
    assert {q: p.answer for q, p in got.items()} == {f"Halve {2 * i}.": str(i) for i in range(1, 7)}
    assert task.is_correct(got["Halve 4."], "\\boxed{2}")


def test_the_answer_format_can_be_set_against_the_data_formats(tmp_path: Path) -> None:
    rows = [{"problem": f"q{i}", "solution": "...", "answer": f"{i},000"} for i in range(1, 5)]
    task = local(write_jsonl(tmp_path / "m.jsonl", rows), answer_format="gsm8k")
    assert task.answer_format.name == "gsm8k"
    assert {p.answer for p in everything(task).values()} == {f"{i}000" for i in range(1, 5)}


@pytest.mark.parametrize("layout", ["jsonl", "saved"])
def test_a_mapped_column_the_data_lacks_names_the_field_and_the_columns(
    tmp_path: Path, layout: str
) -> None:
    path = tmp_path / "math.jsonl"
    write_jsonl(path, MATH_ROWS)
    if layout == "saved":
        path = tmp_path / "saved"
        Dataset.from_list(MATH_ROWS).save_to_disk(path)
    with pytest.raises(TaskDataError) as err:
        local(path, columns={"question": "question_text"})
    assert str(err.value) == (
        "task.local_files.columns.question is 'question_text', which is not a column of "
        f"{path} (it has ['problem', 'solution', 'level', 'type']): set it to one of them"
    )


def test_a_table_without_a_formats_column_is_refused_naming_the_fix(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist([{"problem": "q", "level": "1"}]), tmp_path / "m.parquet")
    with pytest.raises(
        TaskDataError, match=r"lacks columns \['solution'\].*task\.local_files\.columns"
    ):
        local(tmp_path / "m.parquet", data_format="math")


def test_data_whose_format_cannot_be_told_is_refused_naming_its_columns(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "x.jsonl", [{"prompt": "q", "response": "#### 1"}])
    with pytest.raises(
        TaskDataError, match=r"cannot tell the data format .*\['prompt', 'response'\]"
    ):
        local(path)


# ---- bad rows ----------------------------------------------------------------------------------

BAD_MATH_LINE_4 = {
    "no box and no answer column": (
        {"problem": "p", "solution": "It is 3."},
        "'solution' states no final answer (boxed: the last \\boxed{...}",
    ),
    "unclosed box": ({"problem": "p", "solution": "\\boxed{3"}, "'solution' states no final"),
    "unreadable boxed gold": (
        {"problem": "p", "solution": "\\boxed{??}"},
        "gold answer '??': math-verify cannot parse it (read from 'solution')",
    ),
    "unreadable answer column": (
        {"problem": "p", "solution": "\\boxed{3}", "answer": "!!"},
        "gold answer '!!': math-verify cannot parse it (read from 'answer')",
    ),
    "missing problem": ({"solution": "\\boxed{3}"}, "missing 'problem'"),
    "empty problem": ({"problem": "\t", "solution": "\\boxed{3}"}, "'problem' is empty"),
    "solution not text": ({"problem": "p", "solution": ["3"]}, "'solution' must be a string"),
    "boolean answer": (
        {"problem": "p", "answer": True},
        "'answer' must be a string or a number (got boolean)",
    ),
    "nothing to answer with": (
        {"problem": "p", "solution": None, "answer": None},
        "neither 'solution' nor 'answer' has a value",
    ),
}


@pytest.mark.parametrize(("row", "problem"), BAD_MATH_LINE_4.values(), ids=BAD_MATH_LINE_4.keys())
def test_a_bad_math_row_is_named_by_file_and_line_or_skipped(
    tmp_path: Path, row: dict[str, Any], problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = [{"problem": f"q{i}", "solution": f"\\boxed{{{i}}}"} for i in range(6)]
    path = write_jsonl(tmp_path / "math.jsonl", [*good[:3], row, *good[3:]])
    with pytest.raises(TaskDataError) as err:
        local(path, data_format="math")
    assert str(err.value).startswith(f"{path}:4: {problem}")
    assert "task.local_files.on_bad_rows: drop" in str(err.value)
    with caplog.at_level(logging.WARNING, logger=LOG):
        task = local(path, data_format="math", on_bad_rows="drop")
    assert set(everything(task)) == {r["problem"] for r in good}
    assert (
        f"dropped 1 bad row(s) of 7 (task.local_files.on_bad_rows: drop): {path}:4: {problem}"
        in caplog.text
    )


def test_a_question_written_twice_with_two_boxed_answers_is_a_conflict(tmp_path: Path) -> None:
    rows = [*MATH_ROWS[:3], {**MATH_ROWS[1], "solution": "\\boxed{5}"}]
    with pytest.raises(TaskDataError, match=r"math\.jsonl:2: same question with different gold"):
        local(write_jsonl(tmp_path / "math.jsonl", rows))


def test_shared_train_and_test_questions_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", MATH_ROWS[:8])
    test = write_jsonl(tmp_path / "test.jsonl", MATH_ROWS[6:])
    with caplog.at_level(logging.WARNING, logger=LOG):
        task = local(train, test_path=str(test))
    assert len(problems(task, "test")) == 6
    assert "2 of 6 test questions are also training questions" in caplog.text


def test_load_rows_reads_one_file_with_the_same_rules(tmp_path: Path) -> None:
    rows = load_rows(write_jsonl(tmp_path / "math.jsonl", MATH_ROWS))
    assert [r.source.number for r in rows] == list(range(1, 13))
    assert rows[0].answer == "\\frac{1}{2}" and rows[0].meta["type"] == "Algebra"


# ---- the config ---------------------------------------------------------------------------------


def test_the_config_offers_auto_and_each_format_and_refuses_others() -> None:
    schema = TaskConfig.model_json_schema()
    local_files = schema["$defs"]["LocalFilesSettings"]["properties"]
    assert local_files["data_format"]["enum"] == ["auto", *DATA_FORMATS.names()]
    assert schema["properties"]["answer_format"]["enum"][0] == "auto"
    with pytest.raises(ValidationError, match="unknown data format 'csv'"):
        TaskConfig(name="local_files", local_files={"path": "x", "data_format": "csv"})
    with pytest.raises(ValidationError):
        TaskConfig(name="local_files", local_files={"path": "x", "columns": {"questoin": "q"}})
    with pytest.raises(ValidationError, match=r"set task\.answer_format: auto or gsm8k"):
        TaskConfig(name="arith", answer_format="boxed")
    assert TaskConfig(name="arith").answer_format == "auto"


def test_a_missing_path_names_the_field(tmp_path: Path) -> None:
    from grpo_core.contracts.errors import MissingPathError

    write_jsonl(tmp_path / "train.jsonl", MATH_ROWS)
    with pytest.raises(MissingPathError, match=r"nope\.jsonl: fix task\.local_files\.test_path"):
        LocalFilesTask(tmp_path / "train.jsonl", test_path=tmp_path / "nope.jsonl")


# ---- a property: every reader gives the same problems -------------------------------------------

_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(_TEXT, st.integers(-(10**6), 10**6)), min_size=1, max_size=12))
def test_any_valid_rows_read_the_same_from_jsonl_parquet_and_a_saved_dataset(
    tmp_path_factory: pytest.TempPathFactory, pairs: list[tuple[str, int]]
) -> None:
    rows = [{"question": f"Q {q}", "answer": f"work\n#### {a}"} for q, a in pairs]
    expected = {}
    for row, (_, a) in zip(rows, pairs, strict=True):
        expected.setdefault(row["question"].strip(), str(a))
    conflicting = {
        row["question"].strip()
        for row, (_, a) in zip(rows, pairs, strict=True)
        if expected[row["question"].strip()] != str(a)
    }
    folder = tmp_path_factory.mktemp("rows")
    paths = [write_jsonl(folder / "rows.jsonl", rows), folder / "rows.parquet", folder / "saved"]
    pq.write_table(pa.Table.from_pylist(rows), paths[1])
    Dataset.from_list(rows).save_to_disk(paths[2])
    for path in paths:
        if len(conflicting) == len(expected):
            with pytest.raises(TaskDataError, match="no valid rows"):
                local(path, on_bad_rows="drop")
            continue
        got = everything(local(path, on_bad_rows="drop"))
        assert {q.strip(): p.answer for q, p in got.items()} == {
            q: a for q, a in expected.items() if q not in conflicting
        }
