"""GRIT: embedding (bidirectional) and generation (causal) on one model, kept apart, both trained."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from conftest import tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.errors import ConfigError
from lmembed.models.attention import configured_mode
from lmembed.training.rows import TrainExample
from lmembed.training.stages import ObjectiveConfig, run_objective
from lmembed.training.stages.generative import AttentionSwitch, answer_labels, causal_lm_loss, perplexity
from lmembed.training.stages.grit import EMBED_PREFIX, EMBED_TEMPLATE, GritObjective
from lmembed.training.stages.mntp import IGNORE, build_lm_head
from lmembed.training.trainable import TrainableEmbedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QUERIES = ["the cat sat", "a dog was eating", "the man is riding", "protein gene cell"]
DOCS = ["a cat on the mat", "dog eating food", "man riding a horse", "gene study result"]
EXAMPLES = [TrainExample(q, (d,), instruction="search") for q, d in zip(QUERIES, DOCS, strict=True)]
PAIRS = [("the cat sat", "on the mat ."), ("a dog was", "eating food ."), ("hello there", "friend !")]


def _rows_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def grit_model(tokenizer, tmp_path, **options):
    embedder = Embedder.from_model(
        tiny_model("llama", len(tokenizer)),
        tokenizer,
        EmbeddingConfig(pooling="mean", attention="bidirectional"),
        use_cache=False,
        show_progress=False,
    )
    model = TrainableEmbedder(embedder, lora=None)
    gen = _rows_file(tmp_path / "gen.jsonl", [{"query": p, "positive": a} for p, a in PAIRS])
    return GritObjective(model, generative_data=[gen], **options)


def test_answer_labels_score_only_the_answer_tokens(tokenizer):
    batch = answer_labels(tokenizer, ["the cat", None], ["sat on the mat", "hello"], max_length=64)
    prompt = tokenizer("<|user|>\nthe cat\n<|assistant|>\n", add_special_tokens=False)["input_ids"]
    answer = [*tokenizer("sat on the mat", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids[0, : len(prompt)].tolist() == prompt
    assert (labels[0, : len(prompt)] == IGNORE).all()  # the prompt is never scored
    assert labels[0, len(prompt) : len(prompt) + len(answer)].tolist() == answer
    plain = [*tokenizer("hello", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    assert labels[1, : len(plain)].tolist() == plain  # no prompt: the whole text is scored
    assert (labels[1, len(plain) :] == IGNORE).all() and (batch["attention_mask"][1, len(plain) :] == 0).all()


def test_generative_loss_ignores_prompt_tokens(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    head = build_lm_head(model)
    batch = answer_labels(tokenizer, ["the cat sat"], ["on the mat"])
    prompt_len = int((batch["labels"][0] == IGNORE).sum())
    hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    logits = head(hidden)[0]
    targets = batch["input_ids"][0]
    manual = F.cross_entropy(logits[prompt_len - 1 : -1], targets[prompt_len:])
    assert torch.allclose(causal_lm_loss(model, head, batch), manual, atol=1e-6)
    everything = F.cross_entropy(logits[:-1], targets[1:])
    assert not torch.allclose(manual, everything)


def test_grit_passes_see_their_own_attention(tokenizer, tmp_path):
    objective = grit_model(tokenizer, tmp_path)
    backbone = objective.model.model
    attention = next(m for m in backbone.modules() if hasattr(m, "is_causal") and isinstance(m.is_causal, bool))
    seen: list[tuple[str | None, bool, bool]] = []

    def record(module, args, kwargs):
        """(recorded mode, the module's is_causal flag, whether the first query may attend to the second key)."""
        if configured_mode(backbone) is None:
            return  # the probe of a mode switch (configure_attention verifies before recording the mode)
        mask = kwargs.get("attention_mask")
        if mask is None:  # SDPA's own causal path: the flag alone decides
            sees_later = not module.is_causal
        else:
            entry = mask[0, 0, 0, 1]
            sees_later = bool(entry) if entry.dtype == torch.bool else bool(entry == 0)
        seen.append((configured_mode(backbone), module.is_causal, sees_later))

    handle = attention.register_forward_pre_hook(record, with_kwargs=True)
    try:
        _, metrics = objective.loss(EXAMPLES)
    finally:
        handle.remove()
    assert set(metrics) == {"loss_embedding", "loss_generative"}
    embedding, generative = seen[:-1], seen[-1]
    assert len(embedding) == 2  # queries, then positives
    assert all(entry == ("bidirectional", False, True) for entry in embedding)
    assert generative == ("causal", True, False)
    assert configured_mode(backbone) == "bidirectional"  # left as the strategy says


def test_generative_pass_is_causal_after_an_embedding_pass(tokenizer, tmp_path):
    objective = grit_model(tokenizer, tmp_path)
    objective.embedding_loss(EXAMPLES)  # the shared model is now bidirectional
    a = answer_labels(tokenizer, ["the cat"], ["sat on the mat"])
    b = answer_labels(tokenizer, ["the cat"], ["sat on the rug"])
    objective.switch("causal")
    with torch.no_grad():
        ha = objective.model.model(input_ids=a["input_ids"], attention_mask=a["attention_mask"]).last_hidden_state
        hb = objective.model.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    changed = int((a["input_ids"][0] != b["input_ids"][0]).nonzero()[0])
    assert torch.allclose(ha[0, :changed], hb[0, :changed], atol=1e-6)  # nothing before the change sees it
    objective.switch("bidirectional")
    with torch.no_grad():
        ha = objective.model.model(input_ids=a["input_ids"], attention_mask=a["attention_mask"]).last_hidden_state
        hb = objective.model.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
    assert not torch.allclose(ha[0, :changed], hb[0, :changed], atol=1e-6)


def test_grit_training_lowers_both_losses(tokenizer, tmp_path):
    objective = grit_model(tokenizer, tmp_path)
    pairs = PAIRS[:3]

    def measure() -> tuple[float, float]:
        with torch.no_grad():
            return float(objective.embedding_loss(EXAMPLES)), float(objective.generative_loss(pairs))

    before = measure()
    optimizer = torch.optim.AdamW(objective.model.parameters(), lr=3e-3)
    for _ in range(12):
        optimizer.zero_grad()
        objective.loss(EXAMPLES)[0].backward()
        optimizer.step()
    after = measure()
    assert after[0] < before[0] and after[1] < before[1], (before, after)


def test_alternate_mode_runs_one_loss_per_step(tokenizer, tmp_path):
    objective = grit_model(tokenizer, tmp_path, mode="alternate")
    assert set(objective.loss(EXAMPLES)[1]) == {"loss_embedding"}
    assert set(objective.loss(EXAMPLES)[1]) == {"loss_generative"}


def test_grit_options_are_checked(tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="mode"):
        grit_model(tokenizer, tmp_path, mode="both")
    with pytest.raises(ConfigError, match="generative_data"):
        GritObjective(grit_model(tokenizer, tmp_path).model, generative_data=[])
    assert GritObjective(grit_model(tokenizer, tmp_path).model, generative_weight=0).generative is None


def test_perplexity_matches_a_causal_lm_and_restores_the_mode(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    embedder = Embedder.from_model(
        model, tokenizer, EmbeddingConfig(attention="bidirectional"), use_cache=False, show_progress=False
    )
    texts = ["the cat sat on the mat", "a dog"]
    reference = LlamaForCausalLM(model.config).eval()
    reference.model.load_state_dict(model.state_dict())
    reference.lm_head.weight.data.copy_(model.get_input_embeddings().weight)
    nll, count = 0.0, 0
    for text in texts:
        ids = torch.tensor([[*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]])
        with torch.no_grad():
            nll += float(reference(input_ids=ids, labels=ids).loss) * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    configure = AttentionSwitch(model)
    configure("bidirectional")
    assert perplexity(embedder, texts) == pytest.approx(math.exp(nll / count), rel=1e-4)
    assert configured_mode(model) == "bidirectional"


def test_grit_stage_saves_a_model_that_embeds_in_grit_format(tokenizer, tmp_path):
    embedder = Embedder.from_model(
        tiny_model("llama", len(tokenizer)),
        tokenizer,
        EmbeddingConfig(pooling="mean", attention="bidirectional"),
        use_cache=False,
    )
    rows = [{"query": q, "positive": d, "instruction": "search"} for q, d in zip(QUERIES, DOCS, strict=True)]
    gen = [{"query": p, "positive": a} for p, a in PAIRS]
    config = ObjectiveConfig(
        objective="grit",
        data=[_rows_file(tmp_path / "emb.jsonl", rows)],
        output=str(tmp_path / "out"),
        steps=2,
        batch_size=4,
        warmup_steps=0,
        lora=True,
        lora_r=4,
        options={"generative_data": [_rows_file(tmp_path / "gen.jsonl", gen)]},
    )
    result = run_objective(config, embedder=embedder)
    assert len(result.losses) == 2 and all(math.isfinite(x) for x in result.losses)
    loaded = Embedder.from_pretrained(str(result.model_dir), cache=False, show_progress=False)
    assert loaded.config.instruction_template == EMBED_TEMPLATE and loaded.config.plain_prefix == EMBED_PREFIX
    assert loaded.config.attention == "bidirectional"
    assert math.isfinite(perplexity(loaded, ["the cat sat on the mat"]))
