import pytest

from grpo_core.data.answers import answers_match, extract_answer, format_reward, normalize_number


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("3+4=7\n#### 7", "7"),
        ("#### 1,000", "1,000"),
        ("####-5", "-5"),
        ("####   +5  \n", "+5"),
        ("#### 3\nmore\n#### 4", "4"),
        ("no marker 7", None),
        ("#### ", None),
    ],
)
def test_extract_answer(completion: str, expected: str | None) -> None:
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,000", "1000"),
        ("+5", "5"),
        ("-5", "-5"),
        ("2.50", "2.5"),
        ("-0", "0"),
        ("007", "7"),
        (" 1 000 ", "1000"),
        ("5.", "5"),
        ("$12", "12"),
        ("Yes  Sir", "yes sir"),
    ],
)
def test_normalize_number(text: str, expected: str) -> None:
    assert normalize_number(text) == expected


def test_answers_match_is_numeric_and_rejects_missing() -> None:
    assert answers_match("1,000", "1000")
    assert answers_match("+5", "5")
    assert not answers_match("-5", "5")
    assert not answers_match(None, "5")


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("1+2=3\n#### 3", 1.0),
        ("#### 3\n\n", 1.0),
        ("1+2=3", 0.0),
        ("#### 3\n1+2=3", 0.0),
        ("####", 0.0),
        ("#### 3 #### 4", 0.0),
    ],
)
def test_format_reward(completion: str, reward: float) -> None:
    assert format_reward(completion) == reward
