"""Answer formats: the `boxed` format judges LaTeX answers by math-verify through a task's own
check (a table of gold/output pairs, equal and not), extracts the last \\boxed{}, votes equal
answers together, and keeps its timeout in any thread."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from grpo_core.data.answer_formats import ANSWER_FORMATS, last_boxed
from grpo_core.data.math_equivalence import MathVerifier
from grpo_core.data.tasks.base import Problem
from grpo_core.data.tasks.local_files import LocalFilesTask
from grpo_core.model.evaluate import maj_at_k

BOXED = ANSWER_FORMATS["boxed"]

# (gold answer, the answer an output boxes, equal?)
EQUIVALENCE_TABLE: list[tuple[str, str, bool]] = [
    # fractions and decimals
    ("\\frac{1}{2}", "0.5", True),
    ("\\frac12", "\\frac{1}{2}", True),
    ("1/2", "\\frac{1}{2}", True),
    ("\\frac{3}{4}", "0.75", True),
    ("-\\frac{1}{2}", "-0.5", True),
    ("\\dfrac{2}{3}", "\\frac{2}{3}", True),
    ("\\frac{1}{3}", "0.33", False),
    ("\\frac{1}{2}", "\\frac{1}{3}", False),
    ("0.25", "\\frac{1}{4}", True),
    ("\\frac{6}{8}", "\\frac{3}{4}", True),
    # integers, signs, separators
    ("1000", "1,000", True),
    ("1000", "1000.0", True),
    ("-7", "-7", True),
    ("-7", "7", False),
    ("3", "4", False),
    ("42", "042", True),
    # radicals and pi
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("\\sqrt{2}", "\\frac{2}{\\sqrt{2}}", True),
    ("3\\sqrt{2}", "2\\sqrt{3}", False),
    ("2\\pi", "\\pi \\cdot 2", True),
    ("\\pi", "3.14", False),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True),
    # tuples and points
    ("(1, -2)", "(1,-2)", True),
    ("(1, -2)", "(-2, 1)", False),
    ("(0, \\frac{1}{2})", "(0, 0.5)", True),
    # intervals
    ("[0, 1)", "[0,1)", True),
    ("[0, 1)", "[0, 1]", False),
    ("(-\\infty, 2]", "(-\\infty,2]", True),
    ("(2, \\infty)", "(2, \\infty)", True),
    # sets
    ("\\{1, 2\\}", "\\{2, 1\\}", True),
    ("\\{1, 2\\}", "\\{1, 3\\}", False),
    ("\\{3\\}", "\\{3\\}", True),
    # degrees and percentages
    ("90^\\circ", "90", True),
    ("45^{\\circ}", "45^\\circ", True),
    ("30^\\circ", "60^\\circ", False),
    ("50\\%", "0.5", True),
    ("25\\%", "25\\%", True),
    ("25\\%", "0.3", False),
    # matrices
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}2\\\\1\\end{pmatrix}", False),
    (
        "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}",
        "\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}",
        True,
    ),
    # multiple-choice letters
    ("B", "B", True),
    ("(B)", "B", True),
    ("\\text{(A)}", "A", True),
    ("C", "D", False),
    # expressions in variables
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2-1", "(x-1)(x+1)", True),
    ("2x+3", "3+2x", True),
    ("x^2+1", "(x+1)^2", False),
    ("x=5", "5", True),
    ("\\frac{x}{2}", "0.5x", True),
    # infinity and others
    ("\\infty", "\\infty", True),
    ("\\infty", "-\\infty", False),
    ("10^{3}", "1000", True),
    ("2^{10}", "1024", True),
    ("e^{0}", "1", True),
]


@pytest.fixture(scope="module")
def boxed_task(tmp_path_factory: pytest.TempPathFactory) -> LocalFilesTask:
    """A local_files task in the boxed format whose gold answers are the table's."""
    path = tmp_path_factory.mktemp("math") / "gold.jsonl"
    rows = [
        {"question": f"Q{i}: what is it?", "answer": f"so it is \\boxed{{{gold}}}."}
        for i, (gold, _, _) in enumerate(EQUIVALENCE_TABLE)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return LocalFilesTask(path, test_path=path, answer_format="boxed")


def test_the_equivalence_table_through_the_tasks_own_check(boxed_task: LocalFilesTask) -> None:
    assert len(EQUIVALENCE_TABLE) >= 50
    assert sum(not equal for _, _, equal in EQUIVALENCE_TABLE) >= 15
    problems = {p.question: p for p in boxed_task.problems("train", 10_000, seed=0)}
    wrong = []
    for i, (gold, output, equal) in enumerate(EQUIVALENCE_TABLE):
        problem = problems[f"Q{i}: what is it?"]
        assert problem.answer == gold  # the gold answer read from the solution's \boxed{}
        completion = f"Step 1: work.\nSo the answer is $\\boxed{{{output}}}$."
        if boxed_task.is_correct(problem, completion) != equal:
            wrong.append((gold, output, equal))
    assert not wrong


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so \\boxed{5}", "5"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("nested \\boxed{\\{1, \\{2\\}\\}} end", "\\{1, \\{2\\}\\}"),
        ("\\fbox{7}", "7"),
        ("no box here: 7", None),
        ("\\boxed{unclosed", None),
        ("\\boxed{ }", None),
    ],
)
def test_the_last_boxed_answer_is_extracted_with_its_braces(text: str, answer: str | None) -> None:
    assert last_boxed(text) == answer


def test_an_output_without_a_box_has_no_answer_not_its_last_number() -> None:
    assert not BOXED.is_correct("7", "the answer is 7")
    assert BOXED.is_correct("7", "the answer is \\boxed{7}")


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("so $\\boxed{5}$.", 1.0),
        ("\\[ \\boxed{\\frac{1}{2}} \\]", 1.0),
        ("\\boxed{5} and then more words", 0.0),
        ("the answer is 5", 0.0),
        ("\\boxed{}", 0.0),
    ],
)
def test_the_format_reward_asks_for_a_closing_box(completion: str, reward: float) -> None:
    assert BOXED.ends_with_answer(completion) == reward


def test_majority_voting_counts_equal_answers_together() -> None:
    # 1/2 three ways beats 3 twice; the winner is checked against the gold answer
    answers = ["3", "\\frac{1}{2}", "0.5", "3", "1/2", None]
    assert maj_at_k(answers, "0.5", 6, BOXED) == 1.0
    assert maj_at_k(answers, "3", 6, BOXED) == 0.0


def test_a_gold_answer_math_verify_cannot_read_is_named_with_its_line(tmp_path: Path) -> None:
    from grpo_core.data.tasks.base import TaskDataError

    path = tmp_path / "bad.jsonl"
    rows = [{"question": "q1", "answer": "\\boxed{3}"}, {"question": "q2", "answer": "\\boxed{??}"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TaskDataError, match=r"bad\.jsonl:2: gold answer '\?\?': math-verify"):
        LocalFilesTask(path, answer_format="boxed")


def test_a_comparison_past_its_timeout_counts_as_not_equal_in_any_thread() -> None:
    """math-verify's own timeout needs the main thread (SIGALRM); ours kills its worker."""
    verifier = MathVerifier(timeout_s=1.0)
    got: dict[str, object] = {}

    def compare() -> None:  # a factorial of 10^(10^6): math-verify would run for minutes
        start = time.perf_counter()
        got["equal"] = verifier.equal("10^{10^{6}}!", "5")
        got["seconds"] = time.perf_counter() - start

    worker = threading.Thread(target=compare)
    worker.start()
    worker.join(timeout=60)
    assert got["equal"] is False and 1.0 <= float(str(got["seconds"])) < 10
    assert verifier.timeouts == 1
    assert verifier.equal("\\frac{1}{2}", "0.5")  # a fresh worker answers the next one
    assert verifier.equal("10^{10^{6}}!", "5") is False  # a timeout is not kept: asked again
    assert verifier.timeouts == 2
    verifier.close()


def test_the_worker_start_does_not_count_against_the_first_comparison() -> None:
    """Importing sympy and math-verify takes ~0.4 s on a quiet machine (seconds on a busy
    one); a comparison of two small numbers, ~15 ms. Were the start timed with the first
    request, this 0.25 s timeout would fail it and count a right answer wrong."""
    verifier = MathVerifier(timeout_s=0.25)
    assert verifier.equal("\\frac{1}{2}", "0.5") and verifier.timeouts == 0
    verifier.close()


def test_a_repeated_comparison_is_answered_without_the_worker() -> None:
    verifier = MathVerifier()
    asked: list[dict[str, object]] = []
    ask = verifier._ask

    def counting_ask(**request: object) -> object:
        asked.append(request)
        return ask(**request)

    verifier._ask = counting_ask  # type: ignore[method-assign]
    pairs = [("\\frac{5}{6}", "10/12"), ("\\frac{5}{6}", "\\frac{4}{6}")] * 3
    assert [verifier.equal(g, p) for g, p in pairs] == [True, False] * 3
    assert verifier.canonical("10/12") == verifier.canonical("10/12") == "0.833333"
    assert len(asked) == 3  # two distinct pairs and one answer, each asked once
    verifier.clear_cache()
    assert verifier.equal(*pairs[0]) and len(asked) == 4
    verifier.close()


def test_gsm8k_keeps_its_numeric_rules() -> None:
    gsm8k = ANSWER_FORMATS["gsm8k"]
    assert gsm8k.is_correct("1000", "so\n#### 1,000")
    assert not gsm8k.is_correct("1000", "so \\boxed{1000}")
    problem = Problem("p", "q", "5")
    assert gsm8k.equal(problem.answer, "5.0") and gsm8k.canonical("+5") == "5"
