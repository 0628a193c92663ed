"""Published LLM embedders: hub id / folder → preset, refusals, and each preset's vectors against its reference.

Every reference below is written from the authors' published steps (model card code, gritlm, llm2vec), on a tiny
random model saved in the checkpoint's layout, and never calls lmembed's encoding code.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import WORDS, tiny_decoder_config
from lmembed import Embedder
from lmembed.errors import ModelLoadError
from lmembed.models import presets

SPECIALS = ["[PAD]", "[UNK]", "<s>", "</s>", "<|endoftext|>", "<|im_end|>", "<|user|>", "<|embed|>"]
QUERIES = ["what is the protein of a cell", "cat"]
DOCS = ["the cat sat on the mat", "a gene study result on the protein of the cell in science", "dog"]
TASK = "search the document"


def build_tokenizer(bos: bool, eos: str = "</s>"):
    """Word-level fast tokenizer with the chat/embedding special tokens of the families under test."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(WORDS)) + list(":,.!?"))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.add_special_tokens(SPECIALS)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>", eos_token=eos
    )


def save_tiny(folder: Path, family: str, *, bos: bool, eos: str = "</s>", seed: int = 0) -> Path:
    """A tiny random decoder + tokenizer saved with transformers' own file names."""
    from transformers import AutoModel

    tok = build_tokenizer(bos, eos)
    torch.manual_seed(seed)
    model = AutoModel.from_config(tiny_decoder_config(family, len(tok)))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def hub_snapshot(tmp_path: Path, hub_id: str) -> Path:
    """Where huggingface_hub keeps a downloaded model: the folder is recognised by this path."""
    org, name = hub_id.split("/")
    return tmp_path / "hub" / f"models--{org}--{name}" / "snapshots" / "0123abc"


def load_reference(folder: Path, attn: str = "sdpa"):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder, attn_implementation=attn).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def pad(rows: list[list[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        cols = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, cols] = torch.tensor(row)
        mask[i, cols] = 1
    return ids, mask


def forward(model, ids: torch.Tensor, mask: torch.Tensor, bidirectional: bool) -> torch.Tensor:
    """Last hidden states; bidirectional = an eager model given a 4-D mask that hides padding only."""
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        if not bidirectional:
            return model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
        additive = torch.zeros(mask.shape[0], 1, mask.shape[1], mask.shape[1])
        additive = additive.masked_fill(mask[:, None, None, :] == 0, torch.finfo(torch.float32).min)
        return model(input_ids=ids, attention_mask=additive, position_ids=positions).last_hidden_state


def card_last_token_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The e5-mistral / Qwen / gte model cards' last_token_pool."""
    if bool(mask[:, -1].sum() == mask.shape[0]):
        return states[:, -1]
    lengths = mask.sum(dim=1) - 1
    return states[torch.arange(states.shape[0]), lengths]


def assert_close(ours: np.ndarray, reference: torch.Tensor) -> None:
    ref = F.normalize(reference.float(), dim=-1).numpy()
    cosines = (ours * ref).sum(axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert cosines.min() >= 0.9999, cosines


def embedder(folder: Path, **options) -> Embedder:
    return Embedder.from_pretrained(str(folder), cache=False, show_progress=False, **options)


# ---------------------------------------------------------------------------------------------- resolution


@pytest.mark.parametrize(
    ("hub_id", "family"),
    [
        ("intfloat/e5-mistral-7b-instruct", "e5-mistral-7b-instruct"),
        ("Salesforce/SFR-Embedding-Mistral", "SFR-Embedding-Mistral"),
        ("Alibaba-NLP/gte-Qwen2-7B-instruct", "gte-Qwen2-instruct"),
        ("Alibaba-NLP/gte-Qwen2-1.5B-instruct", "gte-Qwen2-instruct"),
        ("Qwen/Qwen3-Embedding-0.6B", "Qwen3-Embedding"),
        ("Qwen/Qwen3-Embedding-8B", "Qwen3-Embedding"),
        ("GritLM/GritLM-7B", "GritLM"),
        ("McGill-NLP/LLM2Vec-Meta-Llama-3-8B-Instruct-mntp-supervised", "LLM2Vec"),
        ("nvidia/NV-Embed-v2", "NV-Embed"),
        ("BAAI/bge-en-icl", "bge-en-icl"),
        ("sentence-transformers/all-MiniLM-L6-v2", None),
        ("Qwen/Qwen3-0.6B", None),
        ("minilm", None),
    ],
)
def test_hub_id_resolves_to_its_preset(hub_id, family):
    found = presets.resolve(hub_id)
    assert (found.preset.family if found else None) == family
    if found:
        assert found.reason == "hub id"
        found.preset.config()  # every preset is a valid strategy


def test_folder_recognised_by_its_files(tmp_path):
    cached = hub_snapshot(tmp_path, "Qwen/Qwen3-Embedding-4B")
    cached.mkdir(parents=True)
    assert presets.resolve(str(cached)).preset.family == "Qwen3-Embedding"

    nv = tmp_path / "nv"
    nv.mkdir()
    (nv / "config.json").write_text(json.dumps({"architectures": ["NVEmbedModel"], "model_type": "nvembed"}))
    assert presets.resolve(str(nv)).reason == "config.json architectures=NVEmbedModel"

    adapter = tmp_path / "sfr-lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "GritLM/GritLM-7B"}))
    assert presets.resolve(str(adapter)).preset.family == "GritLM"

    llm2vec = tmp_path / "mine"
    llm2vec.mkdir()
    (llm2vec / "llm2vec_config.json").write_text("{}")
    assert presets.resolve(str(llm2vec)).preset.family == "LLM2Vec"

    (cached / "lmembed.json").write_text("{}")  # saved by lmembed: its own strategy wins
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    assert presets.resolve(str(cached)) is None and presets.resolve(str(plain)) is None


def test_broken_adapter_config_names_the_file(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"adapter_config.json: line 1"):
        presets.resolve(str(tmp_path))


def test_unreproducible_family_is_refused_before_loading(monkeypatch):
    """No published family is refused today (NV-Embed and bge-en-icl are reproduced); a preset that carries a
    refusal still stops the load, before anything is downloaded, with its reason."""
    refused = presets.Preset(
        family="Unreproducible", hub_ids=("org/unreproducible",), strategy={}, source="-", verified="-", refused="why"
    )
    monkeypatch.setattr(presets, "PRESETS", (*presets.PRESETS, refused))
    with pytest.raises(ModelLoadError, match="lmembed cannot reproduce: why"):
        Embedder.from_pretrained("org/unreproducible")
    assert not [p.family for p in presets.PRESETS if p.refused and p is not refused]


def test_user_option_overriding_a_preset_warns_once_naming_both(tmp_path, caplog):
    folder = save_tiny(hub_snapshot(tmp_path, "intfloat/e5-mistral-7b-instruct"), "mistral", bos=True)
    with caplog.at_level(logging.WARNING, logger="lmembed"):
        emb = embedder(folder, pooling="mean", normalize=True)
    warnings = [r.getMessage() for r in caplog.records if "overrides" in r.getMessage()]
    assert warnings == [
        "pooling='mean' overrides e5-mistral-7b-instruct's published pooling='last'; "
        "its vectors will not match the reference"
    ]
    assert emb.config.pooling == "mean" and emb.config.add_eos is True


# ---------------------------------------------------------------------------------------------- e5 / SFR


def e5_card_reference(folder: Path, texts: list[str], instruction: str | None, append_eos: bool) -> torch.Tensor:
    """e5-mistral card: tokenise to max_length-1 unpadded, append </s> (SFR's card: nothing), pad, last token."""
    model, tok = load_reference(folder)
    inputs = [f"Instruct: {instruction}\nQuery: {t}" if instruction else t for t in texts]
    rows = tok(inputs, max_length=4095, truncation=True, padding=False)["input_ids"]
    rows = [[*row, tok.eos_token_id] for row in rows] if append_eos else rows
    ids, mask = pad(rows, tok.pad_token_id, "right")
    return card_last_token_pool(forward(model, ids, mask, bidirectional=False), mask)


@pytest.mark.parametrize(
    ("hub_id", "append_eos"),
    # SFR's card appends nothing by hand: its tokenizer (add_eos_token) did, so its texts end with </s> too
    [("intfloat/e5-mistral-7b-instruct", True), ("Salesforce/SFR-Embedding-Mistral", True)],
)
def test_e5_mistral_and_sfr_match_their_cards(tmp_path, hub_id, append_eos):
    folder = save_tiny(hub_snapshot(tmp_path, hub_id), "mistral", bos=True)
    emb = embedder(folder)
    assert emb.published.preset.matches(hub_id)
    assert_close(emb.encode_queries(QUERIES, instruction=TASK), e5_card_reference(folder, QUERIES, TASK, append_eos))
    assert_close(emb.encode_corpus(DOCS), e5_card_reference(folder, DOCS, None, append_eos))


# ---------------------------------------------------------------------------------------------- Qwen


def qwen_card_reference(folder: Path, texts: list[str], query_template: str | None, bidirectional: bool):
    """Qwen3-Embedding's first card (gte-Qwen2's likewise): '<|endoftext|>' appended to every text, last token."""
    model, tok = load_reference(folder, attn="eager" if bidirectional else "sdpa")
    eod = tok.convert_tokens_to_ids("<|endoftext|>")
    inputs = [query_template.format(task=TASK, query=t) for t in texts] if query_template else texts
    rows = [[*row, eod] for row in tok(inputs, truncation=True, max_length=8190)["input_ids"]]
    ids, mask = pad(rows, tok.pad_token_id, "left")
    return card_last_token_pool(forward(model, ids, mask, bidirectional), mask)


@pytest.mark.parametrize(
    ("hub_id", "family", "template", "bidirectional"),
    [
        ("Qwen/Qwen3-Embedding-0.6B", "qwen3", "Instruct: {task}\nQuery:{query}", False),
        ("Alibaba-NLP/gte-Qwen2-1.5B-instruct", "qwen2", "Instruct: {task}\nQuery: {query}", True),
    ],
)
def test_qwen_embedders_match_their_cards(tmp_path, hub_id, family, template, bidirectional):
    folder = save_tiny(hub_snapshot(tmp_path, hub_id), family, bos=False, eos="<|im_end|>")
    emb = embedder(folder)
    assert emb.config.attention == ("bidirectional" if bidirectional else "causal")
    queries = emb.encode_queries(QUERIES, instruction=TASK)
    assert_close(queries, qwen_card_reference(folder, QUERIES, template, bidirectional))
    assert_close(emb.encode_corpus(DOCS), qwen_card_reference(folder, DOCS, None, bidirectional))


# ---------------------------------------------------------------------------------------------- GritLM


def gritlm_prefix(instruction: str) -> str:
    return "<|user|>\n" + instruction + "\n<|embed|>\n" if instruction else "<|embed|>\n"


def gritlm_reference(folder: Path, texts: list[str], instruction: str) -> torch.Tensor:
    """gritlm's GritLM.encode, re-implemented: prefix + text, BOS and prefix masked out, bidirectional mean."""
    model, tok = load_reference(folder, attn="eager")
    prefix = gritlm_prefix(instruction)
    enc = tok([prefix + t for t in texts], truncation=True, max_length=512)
    ids, mask = pad(enc["input_ids"], tok.pad_token_id, "right")
    states = forward(model, ids, mask, bidirectional=True)
    mask[:, : len(tok(prefix)["input_ids"])] = 0
    return (states * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)


def test_gritlm_matches_its_encode(tmp_path):
    folder = save_tiny(hub_snapshot(tmp_path, "GritLM/GritLM-7B"), "mistral", bos=True)
    emb = embedder(folder)
    assert_close(emb.encode_queries(QUERIES, instruction=TASK), gritlm_reference(folder, QUERIES, TASK))
    assert_close(emb.encode_corpus(DOCS), gritlm_reference(folder, DOCS, ""))


def test_gritlm_matches_the_gritlm_package(tmp_path):
    gritlm = pytest.importorskip("gritlm")
    folder = save_tiny(hub_snapshot(tmp_path, "GritLM/GritLM-7B"), "mistral", bos=True)
    model, tok = load_reference(folder, attn="eager")

    class Bidirectional(torch.nn.Module):
        """GritLM-7B's own modeling file honours is_causal=False; transformers' Mistral does not, so the
        forward is made bidirectional here and everything else is gritlm's."""

        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask, is_causal=True, **_):
            return (forward(self.inner, input_ids, attention_mask, bidirectional=not is_causal),)

    grit = gritlm.GritLM.__new__(gritlm.GritLM)
    torch.nn.Module.__init__(grit)
    grit.model, grit.tokenizer, grit.embedding_attr, grit.projection = Bidirectional(), tok, None, None
    grit.normalized, grit.pooling_method, grit.embed_eos, grit.attn = True, "mean", "", "bbcc"
    grit.device, grit.num_gpus = "cpu", 1
    tok.padding_side = "right"
    emb = embedder(folder)
    reference = grit.encode(QUERIES, instruction=gritlm_prefix(TASK), convert_to_tensor=True)
    assert_close(emb.encode_queries(QUERIES, instruction=TASK), reference)
    assert_close(emb.encode_corpus(DOCS), grit.encode(DOCS, instruction=gritlm_prefix(""), convert_to_tensor=True))


# ---------------------------------------------------------------------------------------------- LLM2Vec


def save_adapter(model, folder: Path, base: str, seed: int) -> None:
    """A random (non-zero) LoRA adapter on every attention/MLP projection, saved by peft with base recorded."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(folder)
    meta = json.loads((folder / "adapter_config.json").read_text())
    meta["base_model_name_or_path"] = base
    (folder / "adapter_config.json").write_text(json.dumps(meta))


def llm2vec_checkpoints(tmp_path: Path) -> tuple[Path, Path, Path]:
    """base (a tiny Llama), MNTP folder (config + tokenizer + adapter), supervised adapter on the MNTP model."""
    from peft import PeftModel
    from transformers import AutoModel

    base = save_tiny(tmp_path / "base", "llama", bos=True)
    mntp = tmp_path / "LLM2Vec-tiny-mntp"
    save_adapter(AutoModel.from_pretrained(base), mntp, str(base), seed=1)
    AutoModel.from_pretrained(base).config.save_pretrained(mntp)
    build_tokenizer(bos=True).save_pretrained(mntp)
    merged = PeftModel.from_pretrained(AutoModel.from_pretrained(base), mntp).merge_and_unload()
    supervised = tmp_path / "LLM2Vec-tiny-mntp-supervised"
    save_adapter(merged, supervised, str(mntp), seed=2)
    return base, mntp, supervised


def llm2vec_reference(
    base: Path, mntp: Path, supervised: Path | None, texts: list[str], instruction: str, pooling: str = "mean"
) -> torch.Tensor:
    """llm2vec's steps: merge MNTP, apply the supervised adapter, 'instr !@#$%^&*()text' split into the whole
    string and the text alone, embed mask = the last len(text tokens) positions (left padding), mean."""
    from peft import PeftModel
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(base, attn_implementation="eager")
    model = PeftModel.from_pretrained(model, mntp).merge_and_unload()
    model = PeftModel.from_pretrained(model, supervised).eval() if supervised else model.eval()
    tok = AutoTokenizer.from_pretrained(mntp)
    joined = [f"{instruction.strip()} !@#$%^&*(){t}" if instruction else f"!@#$%^&*(){t}" for t in texts]
    parts = [j.split("!@#$%^&*()") for j in joined]
    enc = tok(["".join(p) for p in parts], truncation=True, max_length=512)
    ids, mask = pad(enc["input_ids"], tok.eos_token_id, "left")
    embed_mask = torch.zeros_like(mask)
    for i, (_, text) in enumerate(parts):
        n = len(tok(text, add_special_tokens=False)["input_ids"])
        embed_mask[i, mask.shape[1] - n :] = 1
    states = forward(model, ids, mask, bidirectional=True)
    if pooling == "last_token":  # get_pooling: the last position (left padding)
        return states[:, -1]
    if pooling == "weighted_mean":  # get_pooling: weights 1..n over the last n (embed mask) positions, normalised
        weights = (torch.cumsum(embed_mask, dim=1) * embed_mask).float()
        weights = weights / weights.sum(1, keepdim=True)
        return (states * weights.unsqueeze(-1)).sum(1)
    return (states * embed_mask.unsqueeze(-1)).sum(1) / embed_mask.sum(1, keepdim=True)


def test_llm2vec_adapter_stack_matches_its_steps(tmp_path):
    base, mntp, supervised = llm2vec_checkpoints(tmp_path)
    emb = embedder(supervised)  # recognised: its adapter's base is an LLM2Vec MNTP folder
    assert emb.published.preset.family == "LLM2Vec"
    instruction = "search the document:"
    assert_close(
        emb.encode_queries(QUERIES, instruction=instruction),
        llm2vec_reference(base, mntp, supervised, QUERIES, instruction),
    )
    assert_close(emb.encode_corpus(DOCS), llm2vec_reference(base, mntp, supervised, DOCS, ""))


@pytest.mark.parametrize("mode", ["weighted_mean", "last_token"])
def test_llm2vec_config_json_decides_the_pooling_as_llm2vec_reads_it(tmp_path, mode):
    """``llm2vec_config.json`` only made a folder an LLM2Vec one: its ``pooling_mode`` was ignored (mean pooling
    always, vectors off by up to 0.2 for a weighted_mean model). ``LLM2Vec.from_pretrained`` reads it from the
    adapter folder; so does lmembed, and doctor names the file as what decided the field."""
    base, mntp, supervised = llm2vec_checkpoints(tmp_path)
    (supervised / "llm2vec_config.json").write_text(json.dumps({"pooling_mode": mode, "max_length": 512}))
    emb = embedder(supervised)
    assert emb.config.pooling == {"weighted_mean": "weighted_mean", "last_token": "last"}[mode]
    assert (emb.checkpoint_sources or {})["pooling"] == str(supervised / "llm2vec_config.json")
    instruction = "search the document:"
    assert_close(
        emb.encode_queries(QUERIES, instruction=instruction),
        llm2vec_reference(base, mntp, supervised, QUERIES, instruction, pooling=mode),
    )
    assert_close(emb.encode_corpus(DOCS), llm2vec_reference(base, mntp, supervised, DOCS, "", pooling=mode))


def test_a_merged_llm2vec_save_loads_as_its_own_weights(tmp_path):
    """``LLM2Vec.save(merge_before_save=True)`` writes the merged model with ``llm2vec_config.json`` and no
    adapter: it was refused as "not an adapter checkpoint"; it is read as the full model it is."""
    from peft import PeftModel
    from transformers import AutoModel

    base, mntp, supervised = llm2vec_checkpoints(tmp_path)
    merged = PeftModel.from_pretrained(AutoModel.from_pretrained(base), mntp).merge_and_unload()
    merged = PeftModel.from_pretrained(merged, supervised).merge_and_unload()
    folder = tmp_path / "merged-save"
    merged.save_pretrained(folder)
    build_tokenizer(bos=True).save_pretrained(folder)
    (folder / "llm2vec_config.json").write_text(json.dumps({"pooling_mode": "mean", "skip_instruction": True}))
    emb = embedder(folder)
    assert emb.published.preset.family == "LLM2Vec"
    instruction = "search the document:"
    assert_close(
        emb.encode_queries(QUERIES, instruction=instruction),
        llm2vec_reference(base, mntp, supervised, QUERIES, instruction),
    )


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"pooling_mode": "eos_token"}, "pooling_mode='eos_token' is not one lmembed reproduces"),
        ({"pooling_mode": "bos_token"}, "pooling_mode='bos_token' is not one lmembed reproduces"),
        ({"skip_instruction": False}, "skip_instruction=false pools the instruction"),
        ({"max_length": "512"}, "max_length='512' must be a whole number"),
        ({"pooling": "mean"}, r"unknown key\(s\) pooling; llm2vec reads pooling_mode"),
        ([1, 2], "must hold an object at its top, not an array"),
    ],
)
def test_llm2vec_settings_lmembed_cannot_reproduce_are_refused_by_file_and_key(tmp_path, settings, fragment):
    from lmembed.errors import ModelLoadError

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "llm2vec_config.json").write_text(json.dumps(settings))
    with pytest.raises(ModelLoadError, match=fragment) as caught:
        presets.llm2vec_settings(folder)
    assert str(folder / "llm2vec_config.json") in str(caught.value)


def test_qwen3_queries_default_to_its_folders_query_prompt(tmp_path):
    folder = save_tiny(hub_snapshot(tmp_path, "Qwen/Qwen3-Embedding-0.6B"), "qwen3", bos=False, eos="<|im_end|>")
    emb = embedder(folder)
    web = "Given a web search query, retrieve relevant passages that answer the query"
    assert np.allclose(emb.encode_queries(QUERIES), emb.encode_queries(QUERIES, instruction=web))
    assert not np.allclose(emb.encode_queries(QUERIES), emb.encode_corpus(QUERIES))


def test_llm2vec_mntp_folder_alone(tmp_path):
    """The MNTP checkpoint (config, tokenizer, adapter on the base) is an LLM2Vec model by itself."""
    base, mntp, _ = llm2vec_checkpoints(tmp_path)
    emb = embedder(mntp)
    assert emb.published.reason == "folder name LLM2Vec-tiny-mntp"
    assert_close(emb.encode_corpus(DOCS), llm2vec_reference(base, mntp, None, DOCS, ""))


def test_saving_a_published_model_keeps_its_conventions(tmp_path):
    supervised = llm2vec_checkpoints(tmp_path)[2]
    grit = save_tiny(hub_snapshot(tmp_path, "GritLM/GritLM-7B"), "mistral", bos=True)
    for source in (grit, supervised):
        emb = embedder(source)
        again = embedder(emb.save(tmp_path / f"saved-{source.name}"))
        assert again.published is None and again.config == emb.config  # lmembed.json, not a preset, decides now
        assert np.allclose(
            again.encode_queries(QUERIES, instruction=TASK), emb.encode_queries(QUERIES, instruction=TASK)
        )
        assert np.allclose(again.encode_corpus(DOCS), emb.encode_corpus(DOCS), atol=1e-6)
