"""Pretrained reward models in their own formats and tokenizers (tests/rm_checkpoints.py: a
BPE unlike the policy's characters): each format's scores against a hand computation from the
checkpoint's own logits, the tokens each score is read at, training, frozen weights, reload."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
)

from flows.config_files import load_config
from grpo_core.contracts.errors import SettingError
from grpo_core.model.policy import build_char_tokenizer
from reward_models.config import RewardModelConfig, RewardModelSettings, RMKind
from reward_models.formats import CLASSIFIERS, RM_FORMATS, RMFormat, register_rm_format
from reward_models.heads import classifier_outputs
from reward_models.labelling import OrmLabel, PrmLabel
from reward_models.models import RewardModel, load_or_init_reward_model
from reward_models.scoring import score_outcome, score_steps
from reward_models.sources import check_source
from reward_models.training import (
    RMExample,
    SampleText,
    orm_examples,
    prm_examples,
    train_reward_model,
)
from tests.rm_checkpoints import classifier, rm_tokenizer, step_tag_lm, two_class

PROMPTS = ["Q: 2+2+1\nA:\n", "Q: 1+2\nA:\n", "Q: 1+1\nA:\n"]
COMPLETIONS = ["2+2=4\n4+1=5\n#### 5", "1+2=3\n#### 3", ""]


def ids_of(prompt: str, text: str) -> torch.Tensor:
    """The RM tokenizer's ids of prompt then text, as one unpadded sequence."""
    tok = rm_tokenizer()
    ids = tok(prompt)["input_ids"] + tok(text, add_special_tokens=False)["input_ids"]
    return torch.tensor([ids])


def test_the_bpe_tokens_are_unlike_the_policys_characters() -> None:
    bpe, chars = rm_tokenizer(), build_char_tokenizer()
    text = PROMPTS[0] + COMPLETIONS[0]
    assert len(bpe(text)["input_ids"]) < len(chars(text)["input_ids"]) / 3


def test_a_sequence_classifier_scores_outputs_as_its_own_pooled_head(tmp_path: Path) -> None:
    path = classifier(tmp_path / "a")
    rm = RewardModel.from_checkpoint(path, "orm", "classifier")
    got = score_outcome(rm, PROMPTS, COMPLETIONS, batch_size=3)  # right-padded together
    net = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():  # HF pools the last token: the empty output's is the prompt's last
        want = [
            torch.sigmoid(net(ids_of(p, c)).logits[0, 0]).item()
            for p, c in zip(PROMPTS, COMPLETIONS, strict=True)
        ]
    assert got.tolist() == pytest.approx(want, abs=1e-6)


def test_a_classifier_reads_each_step_at_the_bpe_token_holding_its_last_character(
    tmp_path: Path,
) -> None:
    path = classifier(tmp_path / "a")
    rm = RewardModel.from_checkpoint(path, "prm", "classifier")
    out = score_steps(rm, PROMPTS, COMPLETIONS, batch_size=2)
    # '2+2=4Ċ' | '4+1=' | '5Ċ####Ġ5' and '1+2=' | '3Ċ####Ġ3': the BPE merges a step's end
    # with the whole next step, so both are read at that token (a marker keeps them apart).
    assert out.step_end_tokens == [[0, 2, 2], [1, 1], []]
    net = AutoModelForSequenceClassification.from_pretrained(path).eval()
    prompt_len = len(rm_tokenizer()(PROMPTS[0])["input_ids"])
    full = ids_of(PROMPTS[0], COMPLETIONS[0])
    with torch.no_grad():  # a causal model's score at token p is its score of the first p + 1
        want = [
            torch.sigmoid(net(full[:, : prompt_len + p + 1]).logits[0, 0]).item()
            for p in out.step_end_tokens[0]
        ]
    assert out.scores[0] == pytest.approx(want, abs=1e-6)


def test_a_step_tag_lm_scores_good_against_bad_next_tokens_at_each_tag(tmp_path: Path) -> None:
    path = step_tag_lm(tmp_path / "b")
    rm = RewardModel.from_checkpoint(path, "prm", "step_tag", {"tag": " ки"})
    out = score_steps(rm, PROMPTS, COMPLETIONS, batch_size=3)
    outcome = score_outcome(rm, PROMPTS, COMPLETIONS, batch_size=3)
    tok = rm_tokenizer()
    good, bad = tok.convert_tokens_to_ids("+"), tok.convert_tokens_to_ids("-")
    lm = AutoModelForCausalLM.from_pretrained(path).eval()
    tagged = ["2+2=4 ки\n4+1=5 ки\n#### 5 ки", "1+2=3 ки\n#### 3 ки", " ки"]
    for row, (prompt, text) in enumerate(zip(PROMPTS, tagged, strict=True)):
        ids = ids_of(prompt, text)
        tags = (ids[0] == tok.convert_tokens_to_ids("ки")).nonzero().flatten().tolist()
        with torch.no_grad():
            logits = lm(ids).logits[0]  # the whole vocabulary, as Math-Shepherd reads it
        want = [F.softmax(logits[t, [good, bad]], dim=-1)[0].item() for t in tags]
        assert out.scores[row] == pytest.approx(want[:-1] if row == 2 else want, abs=1e-6)
        assert outcome[row].item() == pytest.approx(want[-1], abs=1e-6)  # the last tag
    assert out.scores[2] == []  # no steps; its outcome was read at the one tag added


def test_a_two_class_prm_scores_class_one_at_each_separator(tmp_path: Path) -> None:
    path = two_class(tmp_path / "c")
    rm = RewardModel.from_checkpoint(path, "prm", "two_class")
    out = score_steps(rm, PROMPTS, COMPLETIONS, batch_size=3)
    tok = rm_tokenizer()
    net = AutoModelForTokenClassification.from_pretrained(path).eval()
    separated = [
        "2+2=4<extra_0>\n4+1=5<extra_0>\n#### 5<extra_0>",
        "1+2=3<extra_0>\n#### 3<extra_0>",
    ]
    assert out.scores[2] == []
    for row, (prompt, text) in enumerate(zip(PROMPTS[:2], separated, strict=True)):
        ids = ids_of(prompt, text)
        seps = (ids[0] == tok.convert_tokens_to_ids("<extra_0>")).nonzero().flatten().tolist()
        with torch.no_grad():
            logits = net(ids).logits[0]
        want = [F.softmax(logits[s], dim=-1)[1].item() for s in seps]
        assert out.scores[row] == pytest.approx(want, abs=1e-6)


def test_two_class_cross_entropy_is_bce_on_the_logit_difference() -> None:
    # Hand values: logits (2.0, -1.0), soft target 0.75 for class 0.
    a, b, t = 2.0, -1.0, 0.75
    ce = -(t * math.log(math.exp(a) / (math.exp(a) + math.exp(b))))
    ce -= (1 - t) * math.log(math.exp(b) / (math.exp(a) + math.exp(b)))
    bce = F.binary_cross_entropy_with_logits(torch.tensor(a - b), torch.tensor(t))
    assert bce.item() == pytest.approx(ce, abs=1e-6)
    assert ce == pytest.approx(0.75 * math.log(1 + math.exp(-3)) + 0.25 * math.log(1 + math.exp(3)))


def toy_set(rm: RewardModel, kind: RMKind) -> list[RMExample]:
    """Outputs answering 3 labelled 1 (both steps), those answering 8 labelled 0: separable
    by the answer's token alone, so a few steps must learn it."""
    texts, orm_rows, prm_rows = {}, [], []
    for i, (question, answer) in enumerate([("1+2", 3), ("2+1", 3), ("1+2", 8), ("2+1", 8)] * 2):
        good = answer == 3
        texts["p", i] = SampleText(f"Q: {question}\nA:\n", f"{question}={answer}\n#### {answer}")
        orm_rows.append(OrmLabel("p", i, int(good)))
        for step in (0, 1):
            prm_rows.append(PrmLabel("p", i, step, "?", 0, 0, 0, int(good), float(good)))
    if kind == "orm":
        return orm_examples(orm_rows, texts, rm.encoder, "new", 0)
    return prm_examples(prm_rows, texts, rm.encoder, "hard", "new", 0)


@pytest.mark.parametrize(
    ("kind", "fmt", "build"),
    [
        ("orm", "classifier", classifier),
        ("prm", "step_tag", step_tag_lm),
        ("prm", "two_class", two_class),
    ],
)
def test_a_few_steps_learn_a_separable_set_and_the_model_reloads_as_saved(
    kind: RMKind, fmt: str, build: Callable[[Path], Path], tmp_path: Path
) -> None:
    settings = RewardModelSettings(source=str(build(tmp_path / "src")), format=fmt)
    rm = load_or_init_reward_model(None, settings.source, kind, settings)
    examples = toy_set(rm, kind)
    cfg = RewardModelConfig(lr=1e-2, epochs=10, batch_size=4)
    metrics, _ = train_reward_model(rm, examples, cfg, seed=0, progress=False)
    assert metrics["loss_last_epoch"] < 0.6 * metrics["loss_first_epoch"], metrics
    prompts = ["Q: 1+2\nA:\n"] * 2
    texts = ["1+2=3\n#### 3", "1+2=8\n#### 8"]
    if kind == "orm":
        right, wrong = score_outcome(rm, prompts, texts).tolist()
        assert right > 0.5 > wrong
    else:
        right_steps, wrong_steps = score_steps(rm, prompts, texts).scores
        assert min(right_steps) > 0.5 > max(wrong_steps)
    rm.save(tmp_path / "saved")
    again = load_or_init_reward_model(tmp_path / "saved", "unused", kind, settings)
    assert (again.format, again.tokens, type(again.net)) == (rm.format, rm.tokens, type(rm.net))
    assert len(again.tokenizer) == len(rm_tokenizer())  # its own tokenizer, saved beside it
    saved = rm.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in again.state_dict().items())
    with pytest.raises(ValueError, match=f"is a {fmt}, expected a scalar_head"):
        load_or_init_reward_model(tmp_path / "saved", "unused", kind)


def test_a_prm_from_a_pretrained_orm_keeps_its_head_format_and_tokenizer(tmp_path: Path) -> None:
    orm = RewardModel.from_checkpoint(step_tag_lm(tmp_path / "b"), "orm", "step_tag")
    orm.save(tmp_path / "orm")
    settings = RewardModelSettings(source="orm", format="step_tag")
    prm = load_or_init_reward_model(None, tmp_path / "orm", "prm", settings, seed=3)
    assert (prm.kind, prm.format, prm.read_ids) == ("prm", "step_tag", orm.read_ids)
    assert (
        score_steps(prm, PROMPTS, COMPLETIONS).scores
        == score_steps(orm, PROMPTS, COMPLETIONS).scores
    )


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ({"good": "+-"}, r"reward_models\.prm\.tokens\.good = '\+-' is 2 tokens"),
        ({"good": "-"}, r"reward_models\.prm: tokens\.good = '-', tokens\.bad = '-' are the same"),
        ({"tag": "4"}, r"reward_models\.prm\.tokens\.tag = '4' is merged with the text around"),
    ],
)
def test_tokens_the_model_cannot_read_are_refused_naming_the_field(
    tokens: dict[str, str], message: str, tmp_path: Path
) -> None:
    path = step_tag_lm(tmp_path / "b")
    with pytest.raises(SettingError, match=message):
        rm = RewardModel.from_checkpoint(path, "prm", "step_tag", tokens)
        score_steps(rm, PROMPTS, COMPLETIONS)


def _negated_scalar(
    net: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None,
    read_ids: tuple[int, ...],
) -> torch.Tensor:
    return -classifier_outputs(net, input_ids, attention_mask, position_ids)[..., 0]


def test_a_format_registered_from_user_code_is_configured_checked_and_scored(
    tmp_path: Path,
) -> None:
    """docs/reward-models.md's extension: a classifier whose logit means 'wrong'."""
    fmt = RMFormat(
        name="wrongness",
        description="a one-logit classifier scoring how wrong an output is",
        logits=_negated_scalar,
        architectures=CLASSIFIERS,
        num_labels=1,
    )
    register_rm_format(fmt)
    try:
        path = classifier(tmp_path / "a")
        cfg = load_config(
            "micro", [f"reward_models.orm.source={path}", "reward_models.orm.format=wrongness"]
        )
        check_source(cfg.reward_models.orm, "orm", None, cfg.reward_models.max_length)
        with pytest.raises(SettingError, match=r"set reward_models\.prm\.format: two_class"):
            check_source(
                RewardModelSettings(source=str(two_class(tmp_path / "c")), format="wrongness"),
                "prm",
                None,
                512,
            )
        wrong = RewardModel.from_checkpoint(path, "orm", "wrongness")
        plain = RewardModel.from_checkpoint(path, "orm", "classifier")
        got = score_outcome(wrong, PROMPTS, COMPLETIONS)
        assert torch.allclose(got, 1 - score_outcome(plain, PROMPTS, COMPLETIONS), atol=1e-6)
    finally:
        RM_FORMATS.remove("wrongness")
