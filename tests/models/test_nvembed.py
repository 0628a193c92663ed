"""NV-Embed (v1/v2) loaded from its checkpoint layout, against an independent re-implementation of the reference.

The reference steps are re-written here from NV-Embed-v2's ``modeling_nvembed.py`` (``NVEmbedModel.encode``,
``input_transform_func``, ``prepare_kwargs_from_batch``, ``BidirectionalMistralModel``, ``LatentAttentionModel``),
not from lmembed: the string ``instruction + text + eos``, a tokenizer call with BOS and padding, the pool mask
that zeroes the first ``len(tokenizer.tokenize(instruction))`` positions (right padding only), a bidirectional
Mistral with positions ``0..n-1``, then the latent attention written with explicit softmax and the masked mean.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from conftest import WORDS, tiny_decoder_config
from lmembed import Embedder
from lmembed.encoding.inputs import InputBuilder
from lmembed.errors import ModelLoadError

QUERIES = ["what is the protein of a cell", "cat", "a study of the gene in science and the cell"]
DOCS = ["the cat sat on the mat", "a gene study result on the protein of the cell in science", "dog"]
TASK = "search the document"
HEADS, HEAD_DIM, LATENTS = 4, 16, 6


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(WORDS) | {"Instruct", "Query"}) + list(":,.!?"))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def head_tensors(dim: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random weights for LatentAttentionModel under the reference's parameter names."""
    inner, ff = HEADS * HEAD_DIM, 4 * dim

    def rand(*shape: int, scale: float = 0.3, base: float = 0.0) -> torch.Tensor:
        return base + scale * torch.randn(*shape, generator=generator)

    return {
        "latents": rand(LATENTS, dim, scale=1.0),
        "cross_attend_blocks.0.norm.weight": rand(dim, scale=0.2, base=1.0),
        "cross_attend_blocks.0.norm.bias": rand(dim, scale=0.1),
        "cross_attend_blocks.0.norm_context.weight": rand(dim, scale=0.2, base=1.0),
        "cross_attend_blocks.0.norm_context.bias": rand(dim, scale=0.1),
        "cross_attend_blocks.0.fn.to_q.weight": rand(inner, dim),
        "cross_attend_blocks.0.fn.to_kv.weight": rand(2 * inner, dim),
        "cross_attend_blocks.0.fn.to_out.weight": rand(dim, inner),
        "cross_attend_blocks.1.norm.weight": rand(dim, scale=0.2, base=1.0),
        "cross_attend_blocks.1.norm.bias": rand(dim, scale=0.1),
        "cross_attend_blocks.1.fn.net.0.weight": rand(2 * ff, dim),
        "cross_attend_blocks.1.fn.net.0.bias": rand(2 * ff, scale=0.1),
        "cross_attend_blocks.1.fn.net.2.weight": rand(dim, ff, scale=0.1),
        "cross_attend_blocks.1.fn.net.2.bias": rand(dim, scale=0.1),
    }


def save_nvembed(folder: Path, padding_side: str = "right", seed: int = 0) -> Path:
    """A tiny NVEmbedModel checkpoint: NV-Embed's config.json sections and safetensors names, in two shards."""
    from transformers import MistralModel

    tok = build_tokenizer()
    torch.manual_seed(seed)
    config = tiny_decoder_config("mistral", len(tok))
    decoder = MistralModel(config)
    text_config = {**config.to_dict(), "model_type": "bidir_mistral", "architectures": ["MistralModel"]}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["NVEmbedModel"],
                "model_type": "nvembed",
                "auto_map": {"AutoModel": "modeling_nvembed.NVEmbedModel"},
                "add_eos": True,
                "add_pad_token": True,
                "is_mask_instruction": True,
                "mask_type": "b",
                "padding_side": padding_side,
                "text_config": text_config,
                "latent_attention_config": {
                    "model_type": "latent_attention",
                    "num_latents_value": LATENTS,
                    "num_cross_heads": HEADS,
                    "cross_dim_head": HEAD_DIM,
                    "hidden_dim": config.hidden_size,
                    "latent_dim": config.hidden_size,
                    "output_normalize": True,
                },
            }
        )
    )
    generator = torch.Generator().manual_seed(seed + 1)
    decoder_state = {f"embedding_model.{k}": v.contiguous() for k, v in decoder.state_dict().items()}
    head = {f"latent_attention_model.{k}": v for k, v in head_tensors(config.hidden_size, generator).items()}
    shards = {"model-00001-of-00002.safetensors": decoder_state, "model-00002-of-00002.safetensors": head}
    for name, tensors in shards.items():
        save_file(tensors, str(folder / name))
    weight_map = {key: name for name, tensors in shards.items() for key in tensors}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    tok.save_pretrained(folder)
    return folder


# ------------------------------------------------------------------------------------ the reference, re-written


def reference_latent_attention(hiddens: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """LatentAttentionModel's two residual blocks (before the pooled mean), with an explicit softmax."""

    def layer_norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), w[f"{name}.weight"], w[f"{name}.bias"])

    def heads(x: torch.Tensor) -> torch.Tensor:  # 'b n (h d) -> (b h) n d'
        b, n, _ = x.shape
        return x.reshape(b, n, HEADS, HEAD_DIM).permute(0, 2, 1, 3).reshape(b * HEADS, n, HEAD_DIM)

    b, n, _ = hiddens.shape
    latents = w["latents"].unsqueeze(0).repeat(b, 1, 1)
    q = layer_norm(hiddens, "cross_attend_blocks.0.norm") @ w["cross_attend_blocks.0.fn.to_q.weight"].T
    kv = layer_norm(latents, "cross_attend_blocks.0.norm_context") @ w["cross_attend_blocks.0.fn.to_kv.weight"].T
    k, v = kv.chunk(2, dim=-1)
    q, k, v = heads(q), heads(k), heads(v)
    weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(HEAD_DIM), dim=-1)
    out = (weights @ v).reshape(b, HEADS, n, HEAD_DIM).permute(0, 2, 1, 3).reshape(b, n, HEADS * HEAD_DIM)
    hiddens = out @ w["cross_attend_blocks.0.fn.to_out.weight"].T + hiddens
    y = layer_norm(hiddens, "cross_attend_blocks.1.norm")
    y = y @ w["cross_attend_blocks.1.fn.net.0.weight"].T + w["cross_attend_blocks.1.fn.net.0.bias"]
    half = y.shape[-1] // 2
    y = y[..., :half] * F.gelu(y[..., half:])
    y = y @ w["cross_attend_blocks.1.fn.net.2.weight"].T + w["cross_attend_blocks.1.fn.net.2.bias"]
    return y + hiddens


def reference_encode(folder: Path, texts: list[str], instruction: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """NVEmbedModel.encode's steps: returns (L2-normalised vectors, pool_mask)."""
    from safetensors import safe_open
    from transformers import AutoTokenizer, MistralConfig, MistralModel

    config = json.loads((folder / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(folder)
    tok.pad_token, tok.padding_side = tok.eos_token, config["padding_side"]  # add_pad_token()
    batch = tok([instruction + t + tok.eos_token for t in texts], max_length=4096, padding=True, truncation=True)
    ids, mask = torch.tensor(batch["input_ids"]), torch.tensor(batch["attention_mask"])
    masked = config["padding_side"] == "right" and config["is_mask_instruction"] and len(instruction) > 0
    instruction_lens = len(tok.tokenize(instruction)) if masked else 0
    pool_mask = mask.clone()
    pool_mask[:, :instruction_lens] = 0

    weights: dict[str, torch.Tensor] = {}
    for shard in folder.glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            weights.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    text_config = {k: v for k, v in config["text_config"].items() if k not in ("model_type", "architectures")}
    model = MistralModel._from_config(MistralConfig(**text_config), attn_implementation="eager").eval()
    model.load_state_dict({k[len("embedding_model.") :]: v for k, v in weights.items() if k.startswith("embedding_")})
    # BidirectionalMistralModel: _prepare_4d_attention_mask (padding only), positions 0..n-1
    additive = torch.zeros(ids.shape[0], 1, ids.shape[1], ids.shape[1])
    additive = additive.masked_fill(mask[:, None, None, :] == 0, torch.finfo(torch.float32).min)
    positions = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    head = {k[len("latent_attention_model.") :]: v for k, v in weights.items() if k.startswith("latent_")}
    with torch.no_grad():
        states = model(input_ids=ids, attention_mask=additive, position_ids=positions).last_hidden_state
        states = reference_latent_attention(states, head)
    pooled = (states * pool_mask.unsqueeze(-1).float()).sum(1) / pool_mask.sum(1, keepdim=True).float()
    return F.normalize(pooled, p=2, dim=-1), pool_mask


def prompt(task: str) -> str:
    return f"Instruct: {task}\nQuery: "


def assert_close(ours: np.ndarray, reference: torch.Tensor) -> None:
    cosines = (torch.from_numpy(ours).float() * reference).sum(-1) / torch.from_numpy(ours).float().norm(dim=-1)
    assert cosines.min() >= 0.9999, cosines


def embedder(folder: Path, **options) -> Embedder:
    return Embedder.from_pretrained(str(folder), cache=False, show_progress=False, **options)


# ------------------------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_nvembed_matches_its_reference_forward(tmp_path, padding_side):
    folder = save_nvembed(tmp_path / "NV-Embed-v2", padding_side)
    emb = embedder(folder)
    assert emb.published.preset.family == "NV-Embed"
    assert emb.published.reason == "config.json architectures=NVEmbedModel"
    reference, _ = reference_encode(folder, QUERIES, prompt(TASK))
    assert_close(emb.encode_queries(QUERIES, instruction=TASK), reference)
    assert_close(emb.encode_corpus(DOCS), reference_encode(folder, DOCS)[0])
    alone = np.concatenate([emb.encode_queries([q], instruction=TASK) for q in QUERIES])  # unpadded, one by one
    assert_close(alone, reference)


def test_nvembed_pool_mask_counts_the_instruction_as_its_code_does(tmp_path):
    """The reference zeroes len(tokenizer.tokenize(instruction)) positions from the start, BOS included: with a
    tokenizer that has no trailing-space token, the instruction's last token (':') stays in the mean."""
    folder = save_nvembed(tmp_path / "nv")
    emb = embedder(folder)
    builder = InputBuilder(emb.backbone.tokenizer, emb.config, is_decoder=True, max_length=128)
    _, reference_mask = reference_encode(folder, QUERIES[:1], prompt(TASK))
    ours = builder.build_all(QUERIES[:1], TASK)[0]
    assert ours.pool_mask == reference_mask[0].tolist()
    tokens = emb.backbone.tokenizer.convert_ids_to_tokens(ours.input_ids)
    first_pooled = ours.pool_mask.index(1)
    assert tokens[0] == "<s>" and tokens[first_pooled] == ":" and tokens[-1] == "</s>"


def test_nvembed_head_differs_from_plain_mean_and_survives_a_save(tmp_path):
    folder = save_nvembed(tmp_path / "nv")
    emb = embedder(folder)
    vectors = emb.encode_queries(QUERIES, instruction=TASK)
    mean = embedder(folder, pooling="mean").encode_queries(QUERIES, instruction=TASK)
    assert float((vectors * mean).sum(axis=1).min()) < 0.99  # the head is really applied
    saved = emb.save(tmp_path / "saved")
    again = embedder(saved)
    assert again.config.latent.variant == "nv-embed"
    np.testing.assert_allclose(again.encode_queries(QUERIES, instruction=TASK), vectors, atol=1e-5)


def test_nvembed_checkpoint_without_head_weights_is_refused(tmp_path):
    folder = save_nvembed(tmp_path / "nv")
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model-00002-of-00002\.safetensors"):
        embedder(folder)


def test_doctor_checks_pass_on_nvembed(tmp_path):
    from lmembed.evaluation.doctor import provenance, run_checks

    emb = embedder(save_nvembed(tmp_path / "nv"))
    checks = {c.name: c for c in run_checks(emb)}
    assert [c.detail for c in checks.values() if c.passed is False] == []
    assert checks["attention"].passed and checks["padding"].passed
    assert checks["prompt-pooling"].passed is None and "token_count" in checks["prompt-pooling"].detail
    sources = {f.name: f.source for f in provenance(emb)}
    assert sources["instruction_mask"].startswith("preset NV-Embed")
    assert sources["latent"] == "config.json latent_attention_config"
