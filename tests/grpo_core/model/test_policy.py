from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import (
    build_char_tokenizer,
    build_policy,
    create_tiny_policy,
    encode_prompt,
    ensure_pad_token,
    holds_weights,
    load_policy,
    without_tied_copies,
)
from grpo_core.model.prompts import Prompter


def test_char_tokenizer_round_trips_one_token_per_character() -> None:
    tok = build_char_tokenizer()
    text = "Q: 3+4-2\nA:\n3+4=7\n#### 5"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok(text)["input_ids"][0] == tok.bos_token_id
    assert {tok.pad_token_id, tok.eos_token_id, tok.bos_token_id} == {0, 1, 2}


def test_tiny_policy_is_seeded_and_saves_like_any_hf_model(tmp_path: Path) -> None:
    tok = build_char_tokenizer()
    cfg = PolicyConfig(seed=7)
    a, b = create_tiny_policy(cfg, tok), create_tiny_policy(cfg, tok)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    a.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, loaded_tok = load_policy(tmp_path)
    ids = torch.tensor([encode_prompt(loaded_tok, "Q: 1+1\nA:\n")])
    assert torch.allclose(model(ids).logits, a(ids).logits, atol=1e-6)
    assert (
        loaded_tok.decode(loaded_tok("7-2=5\n")["input_ids"], skip_special_tokens=True) == "7-2=5\n"
    )


def test_build_policy_kinds(tmp_path: Path) -> None:
    model, tok = build_policy(PolicyConfig(kind="tiny", n_layers=1))
    assert model.config.num_hidden_layers == 1 and model.config.vocab_size == len(tok)
    with pytest.raises(ValueError, match=r"policy\.path"):
        build_policy(PolicyConfig(kind="local"))
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_policy(tmp_path)
    for width, heads in ((130, 4), (30, 2)):  # not a multiple; an odd head width (RoPE)
        with pytest.raises(ValueError, match=r"policy\.hidden_size .* even multiple"):
            PolicyConfig(hidden_size=width, n_heads=heads)
    with pytest.raises(ValueError, match=r"multiple of policy\.n_kv_heads"):
        PolicyConfig(n_heads=4, n_kv_heads=3)


def test_plain_prompt_and_pad_rule() -> None:
    tok = build_char_tokenizer()
    assert Prompter(tok)("3+4") == "Q: 3+4\nA:\n"
    tok.pad_token = None
    with pytest.warns(UserWarning, match="EOS"):
        ensure_pad_token(tok)
    assert tok.pad_token_id == tok.eos_token_id


def test_a_truncated_checkpoint_names_the_directory_and_the_way_out(tmp_path: Path) -> None:
    from grpo_core.model.policy import CorruptCheckpointError

    tok = build_char_tokenizer()
    model = create_tiny_policy(PolicyConfig(n_layers=1, hidden_size=32, n_heads=2), tok)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {tmp_path} cannot be read"):
        load_policy(tmp_path)


@pytest.mark.parametrize("tied", [True, False])
def test_a_skeleton_saves_weights_held_elsewhere_as_the_model_would(
    tmp_path: Path, tied: bool
) -> None:
    """The GRPO stage's model when Ray ranks hold the weights: no weights in memory, and a
    save from the ranks' dict writes the files a save of the trained model writes (a tied head
    once)."""
    tok = build_char_tokenizer()
    trained = create_tiny_policy(PolicyConfig(seed=3, tie_embeddings=tied), tok)
    trained.save_pretrained(tmp_path / "policy_0")
    tok.save_pretrained(tmp_path / "policy_0")
    skeleton, tokenizer = load_policy(tmp_path / "policy_0", "bfloat16", weights=False)
    assert not holds_weights(skeleton) and holds_weights(trained)
    assert {p.dtype for p in skeleton.parameters()} == {torch.bfloat16}
    assert tokenizer.pad_token_id == tok.pad_token_id
    with torch.no_grad():
        for param in trained.parameters():
            param.add_(1.0)  # an update elsewhere
    held = {name: t.clone() for name, t in trained.state_dict().items()}  # a rank's copy
    kept = without_tied_copies(skeleton, held)
    assert ("lm_head.weight" in kept) is not tied and len(held) - len(kept) == int(tied)
    skeleton.save_pretrained(tmp_path / "from_skeleton", state_dict=kept)
    tokenizer.save_pretrained(tmp_path / "from_skeleton")
    trained.save_pretrained(tmp_path / "from_model")
    want = load_file(tmp_path / "from_model" / "model.safetensors")
    got = load_file(tmp_path / "from_skeleton" / "model.safetensors")
    assert set(got) == set(want)
    assert all(torch.equal(got[name], want[name]) for name in want)
    reloaded = load_policy(tmp_path / "from_skeleton")[0]
    assert all(torch.equal(reloaded.state_dict()[n], t) for n, t in held.items())
