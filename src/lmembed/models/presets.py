"""Published LLM embedders as presets: how each family's authors turn a text into a vector.

One :class:`Preset` per family, declarative: the Hub ids it covers, the strategy as
:class:`~lmembed.config.EmbeddingConfig` options (pooling, attention, instruction format, EOS, pooling mask,
max length, normalisation), the padding side of the reference code (lmembed's vectors do not depend on it,
``lmembed doctor`` checks that), the per-task instruction table its MTEB scores were produced with, the
reference it was read from (model card or code, with revision) and how lmembed's reproduction was checked.
A family lmembed cannot reproduce carries ``refused``: loading it raises
:class:`~lmembed.errors.ModelLoadError` with that reason instead of producing approximate vectors.

Resolution is pure (no network, no model loaded): :func:`preset_for_id` matches a Hub id, :func:`recognise`
a local folder by its files (a Hub cache path, ``llm2vec_config.json``, an adapter whose base is a known id,
``config.json``'s ``architectures`` or recorded name) or, last, by its name (a ``git clone`` of the
repository). A folder lmembed saved (``lmembed.json``) is never matched: its own strategy wins.

A family whose reference ends every text with a token that last-token pooling reads says so
(:func:`required_final_token`): lmembed checks the ids the tokenizer really produced and appends the token only
where it is missing, and ``lmembed doctor`` shows them. Encoders without a preset whose sentence-transformers folder
declares no prompts (e5-base-v2's ``query: ``/``passage: ``, bge's retrieval instruction) get the prompts mteb's
model registry records for their Hub id (:func:`add_registry_prompts`, offline). A published reranker's default
maximum length is its model card's (:func:`reranker_max_length`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from lmembed.citations import check_keys
from lmembed.config import EmbeddingConfig
from lmembed.errors import ModelLoadError, UnknownNameError
from lmembed.io import is_whole_number, read_json
from lmembed.load_spec import STRATEGY_FILE
from lmembed.models.sentence_transformers_folder import DOCUMENT_PROMPT_NAMES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preset:
    """One published family's conventions (see the module doc)."""

    family: str
    hub_ids: tuple[str, ...]  # exact ids or shell patterns, matched case-insensitively
    strategy: Mapping[str, Any]
    source: str
    verified: str
    padding_side: Literal["left", "right"] = "left"
    instructions: str | None = None  # a table of evaluation.instructions
    loader: Literal["transformers", "llm2vec", "nvembed"] = "transformers"
    architectures: tuple[str, ...] = ()  # config.json architectures that identify the family on their own
    limits: str = ""  # what differs from the reference, and when
    refused: str | None = None
    # the reference puts few-shot examples before its template (bge-en-icl): a template that ends with the published
    # one adds examples, as the reference does, and is not warned about as an override
    examples_before_template: bool = False
    #: the family's paper(s) (keys of :data:`lmembed.citations.CITATIONS`): a saved model's card cites them
    cites: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_keys(self.cites, f"preset {self.family}")

    def config(self, **overrides: Any) -> EmbeddingConfig:
        """The preset's strategy as an :class:`EmbeddingConfig` (``overrides`` replace fields)."""
        return EmbeddingConfig.from_dict({**self.strategy, **overrides})

    def matches(self, hub_id: str) -> bool:
        name = hub_id.strip().lower()
        return any(fnmatchcase(name, pattern.lower()) for pattern in self.hub_ids)

    def check_reproducible(self, where: str) -> None:
        """Raise :class:`ModelLoadError` when lmembed cannot reproduce this family."""
        if self.refused:
            raise ModelLoadError(f"{where} is a {self.family} model, which lmembed cannot reproduce: {self.refused}")


@dataclass(frozen=True)
class Resolution:
    """Which preset a name or folder resolved to, and what decided it."""

    preset: Preset
    hub_id: str | None
    reason: str  # e.g. "hub id", "adapter_config.json base_model_name_or_path"
    files: dict[str, str] = field(default_factory=dict)


E5_TEMPLATE = "Instruct: {instruction}\nQuery: "
BGE_ICL_TEMPLATE = "<instruct>{instruction}\n<query>"
BGE_ICL_SUFFIX = "\n<response>"
BGE_ICL_DEFAULT_TASK = "Given a query, retrieval relevant passages that answer the query."  # FlagICLModel's, sic


def bge_icl_template(examples: Sequence[Mapping[str, str]], task: str = BGE_ICL_DEFAULT_TASK) -> str:
    """bge-en-icl's instruction template with few-shot ``examples`` in front, as FlagICLModel.set_examples builds
    them: each ``{"instruct": ..., "query": ..., "response": ...}`` (``instruct`` defaulting to ``task``) as
    ``<instruct>{instruct}\\n<query>{query}\\n<response>{response}``, joined and followed by a blank line."""
    shots = [
        f"<instruct>{ex.get('instruct', task)}\n<query>{ex.get('query', '')}\n<response>{ex.get('response', '')}"
        for ex in examples
    ]
    prefix = "\n\n".join(shots) + "\n\n" if shots else ""
    return prefix.replace("{", "{{").replace("}", "}}") + BGE_ICL_TEMPLATE


PRESETS: tuple[Preset, ...] = (
    Preset(
        family="e5-mistral-7b-instruct",
        cites=("wang2024e5mistral",),
        hub_ids=("intfloat/e5-mistral-7b-instruct",),
        strategy={
            "pooling": "last",
            "attention": "causal",
            "instruction_template": E5_TEMPLATE,
            "add_eos": True,
            "max_length": 4096,
            "normalize": True,
        },
        padding_side="right",
        instructions="mteb",
        source="model card 'Transformers' usage (rev 07163b72): tokenise to max_length-1 without padding, append "
        "</s>, pad, last_token_pool, L2-normalise; queries get 'Instruct: {task}\\nQuery: ', documents nothing",
        verified="tests/models/test_presets.py: the card's steps re-implemented on a tiny MistralModel saved in the "
        "checkpoint's layout, cosine >= 0.9999",
        limits="none found at the token level: a long query is cut as the card cuts it, instruction and text "
        "together at max_length - 1, then </s> (tests/encoding/test_inputs_one_pass.py)",
    ),
    Preset(
        family="SFR-Embedding-Mistral",
        hub_ids=("salesforce/sfr-embedding-mistral", "salesforce/sfr-embedding-2_r"),
        strategy={
            "pooling": "last",
            "attention": "causal",
            "instruction_template": E5_TEMPLATE,
            "add_eos": True,
            "max_length": 4096,
            "normalize": True,
        },
        padding_side="right",
        instructions="mteb",
        source="model card usage (rev 938c560d): tokenizer(..., max_length=4096, padding, truncation), "
        "last_token_pool, L2-normalise; mteb's Salesforce wrapper: the instruction on queries only. The card appends "
        "no </s> by hand: its tokenizer_config.json sets add_eos_token, which the transformers of its time applied, "
        "so every text it pooled ends with </s>",
        verified="tests/models/test_presets.py (the card's steps on a tiny MistralModel) and "
        "tests/models/test_token_level.py (a byte-level BPE tokenizer whose tokenizer.json adds only <s>, as "
        "transformers 5 reads the checkpoint, against the card's steps with the </s> its tokenizer appended), "
        "cosine >= 0.9999",
        limits="</s> is appended by lmembed where the tokenizer does not put it there itself (transformers >= 5 "
        "ignores tokenizer_config add_eos_token); `lmembed doctor` shows the last token ids of each text",
    ),
    Preset(
        family="gte-Qwen2-instruct",
        cites=("li2023gte",),
        hub_ids=("alibaba-nlp/gte-qwen2-*-instruct",),
        strategy={
            "pooling": "last",
            "attention": "bidirectional",
            "instruction_template": E5_TEMPLATE,
            "add_eos": True,
            "eos_token": "<|endoftext|>",
            "max_length": 8192,
            "normalize": True,
        },
        padding_side="right",
        instructions="mteb",
        source="model card (last_token_pool, 'Instruct: {task}\\nQuery: ', max_length 8192, normalised); its "
        "config.json is_causal=false and modeling_qwen.py (commit 2c527fb: SDPA attention is_causal=False) run "
        "it bidirectionally; mteb's gte wrapper appends the EOS (add_eos_token=True)",
        verified="tests/models/test_presets.py: the steps re-implemented on a tiny Qwen2Model with an eager "
        "padding-only mask, cosine >= 0.9999",
        limits="earlier revisions of modeling_qwen.py (and mteb's first gte wrapper, attn='cccc') ran it causally; "
        "pass attention='causal' to reproduce those",
    ),
    Preset(
        family="Qwen3-Embedding",
        cites=("zhang2025qwen3embedding",),
        hub_ids=("qwen/qwen3-embedding-*",),
        strategy={
            "pooling": "last",
            "attention": "causal",
            "instruction_template": "Instruct: {instruction}\nQuery:",
            "query_instruction": "Given a web search query, retrieve relevant passages that answer the query",
            "add_eos": True,
            "eos_token": "<|endoftext|>",
            "max_length": 8192,
            "normalize": True,
        },
        padding_side="left",
        instructions="qwen3",
        source="model card 'Transformers usage' (Qwen3-Embedding, June 2025): left padding, '<|endoftext|>' "
        "ends every text (appended by hand in the first card, by tokenizer.json's post-processor since), "
        "last-token pooling, 'Instruct: {task}\\nQuery:' (no space) on queries (by default its "
        "config_sentence_transformers.json query prompt's web-search task), max_length 8192, normalised; MTEB "
        "instructions: the Qwen3-Embedding repository's evaluation code (evaluation/qwen3_embedding_model.py "
        "get_instruction and task_prompts.json), see lmembed.evaluation.instructions.QWEN3_INSTRUCTIONS",
        verified="tests/models/test_presets.py: the card's steps re-implemented on a tiny Qwen3Model, cosine >= 0.9999",
    ),
    Preset(
        family="GritLM",
        cites=("muennighoff2024grit",),
        hub_ids=("gritlm/gritlm-*",),
        strategy={
            "pooling": "mean",
            "attention": "bidirectional",
            "instruction_template": "<|user|>\n{instruction}\n<|embed|>\n",
            "plain_prefix": "<|embed|>\n",
            "max_length": 512,
            "normalize": True,
        },
        padding_side="right",
        instructions="mteb",
        source="gritlm 1.0.2 (gritlm/gritlm.py GritLM.encode) and the GritLM README: text = "
        "'<|user|>\\n{instruction}\\n<|embed|>\\n' (or '<|embed|>\\n' alone) + text, BOS and that prefix masked out "
        "of the mean, is_causal=False for embedding (attn='bbcc'), max_length 512, normalised",
        verified="tests/models/test_presets.py: GritLM.encode of the gritlm package itself (its model's forward "
        "made bidirectional with an eager padding-only mask) and an independent re-implementation, cosine >= 0.9999",
    ),
    Preset(
        family="LLM2Vec",
        cites=("behnamghader2024llm2vec",),
        hub_ids=("mcgill-nlp/llm2vec-*",),
        strategy={
            "pooling": "mean",
            "attention": "bidirectional",
            "instruction_template": "{instruction} ",
            "pool_special_tokens": False,
            "instruction_mask": "text_tokens",
            "max_length": 512,
            "normalize": True,
        },
        padding_side="left",
        instructions="mteb-llm2vec",
        loader="llm2vec",
        source="llm2vec 0.2.3 (llm2vec/llm2vec.py from_pretrained, tokenize, get_pooling): base model, MNTP LoRA "
        "merged, supervised LoRA on top; bidirectional; '{instruction} ' + text with the embed mask on the last "
        "len(tokenizer(text, add_special_tokens=False)) positions (the text tokenised alone: no BOS, no "
        "instruction, counted rather than located, so a byte-level BPE that splits ' what' in context unlike "
        "'what' alone moves the mask as it does there); mean pooling, max_length 512; mteb normalises the "
        "instruction to end in ':'",
        verified="tests/models/test_presets.py: base + MNTP + supervised adapters saved with peft in the "
        "checkpoints' layout, llm2vec's steps re-implemented (peft merge, eager padding-only mask, embed mask), "
        "cosine >= 0.9999 (llm2vec itself pins transformers<=4.44.2 and cannot be installed beside lmembed); "
        "tests/models/test_token_level.py: the embed mask's count on a byte-level BPE (Llama-3 style) tokenizer",
        limits="llm2vec cuts a text over 400 tokens (doc_max_length) by a word ratio before tokenising; lmembed "
        "cuts at max_length tokens, so texts over 400 tokens differ; llm2vec strips the instruction (an instruction "
        "given with leading or trailing whitespace differs); the chat wrappers llm2vec adds when a base "
        "model is loaded under its original name from a local folder are not applied (MTEB loads it by Hub id, "
        "where llm2vec applies none)",
    ),
    Preset(
        family="NV-Embed",
        cites=("lee2024nvembed",),
        hub_ids=("nvidia/nv-embed-v1", "nvidia/nv-embed-v2"),
        strategy={
            "pooling": "latent_attention",
            "attention": "bidirectional",
            "instruction_template": E5_TEMPLATE,
            "instruction_mask": "token_count",
            "add_eos": True,
            "max_length": 32768,
            "normalize": True,
            "latent": {"variant": "nv-embed", "num_latents": 512, "num_heads": 8, "head_dim": 4096, "hidden_mult": 4},
        },
        padding_side="right",
        architectures=("NVEmbedModel",),
        instructions="nv-embed",
        loader="nvembed",
        source="NV-Embed-v2 modeling_nvembed.py (Hub repository code: NVEmbedModel.encode, input_transform_func, "
        "prepare_kwargs_from_batch, LatentAttentionModel): instruction + text + '</s>' tokenised with BOS, right "
        "padding, a bidirectional Mistral (padding-only mask), then LatentAttentionModel on the normed last states: "
        "token states attend (LayerNorm'd, 8 heads of width 4096, no biases, no mask) to the 512 LayerNorm'd "
        "latents with a residual, a LayerNorm'd GEGLU feed-forward (x4) with a residual, the mean over pool_mask, "
        "L2-normalised; pool_mask zeroes the first len(tokenizer.tokenize(instruction)) positions (BOS included) "
        "when padding_side is right and is_mask_instruction; documents get no instruction",
        verified="tests/models/test_nvembed.py: a tiny MistralModel and head saved in the checkpoint's layout "
        "(config.json text_config/latent_attention_config, embedding_model.* and latent_attention_model.* in "
        "safetensors) against an independent re-implementation of the reference's forward and pool mask, "
        "left and right batches, cosine >= 0.9999",
        limits="a text longer than max_length: the reference cuts the whole 'instruction + text + </s>' string (so "
        "the </s> is lost), lmembed cuts the text and keeps the </s>; the reference runs under CUDA autocast "
        "(bfloat16/float16 matmuls) on a GPU, lmembed in the dtype asked for",
    ),
    Preset(
        family="bge-en-icl",
        cites=("li2024bgeicl",),
        hub_ids=("baai/bge-en-icl",),
        strategy={
            "pooling": "last",
            "attention": "causal",
            "instruction_template": BGE_ICL_TEMPLATE,
            "instruction_suffix": BGE_ICL_SUFFIX,
            "query_instruction": BGE_ICL_DEFAULT_TASK,
            "add_eos": True,
            "max_length": 512,
            "normalize": True,
        },
        padding_side="left",
        instructions=None,
        examples_before_template=True,
        source="FlagEmbedding FlagICLModel (FlagEmbedding/flag_models.py, encode_queries/encode_corpus, and the "
        "BGE-EN-ICL model card): a query is examples prefix + '<instruct>{task}\\n<query>{query}' + '\\n<response>' "
        "(examples '<instruct>{task}\\n<query>{q}\\n<response>{r}' joined by blank lines, none by default), the "
        "default task 'Given a query, retrieval relevant passages that answer the query.'; documents as they are; "
        "tokenised with the tokenizer's own special tokens (its tokenizer_config.json add_eos_token: every text "
        "ends with </s> under the transformers it was released with), causal, last-token pooling, normalised, "
        "max_length 512",
        verified="tests/models/test_bge_icl.py: FlagICLModel's steps (including its truncate-and-decode of the "
        "query) re-implemented on a tiny MistralModel with a byte-level tokenizer that ends texts with </s>, with "
        "and without examples, cosine >= 0.9999; tests/models/test_token_level.py: a tokenizer that adds only <s> "
        "(transformers 5 reading the checkpoint), </s> appended as the reference's tokenizer did",
        limits="</s> is appended by lmembed where the tokenizer does not put it there itself; few-shot examples are "
        "part of the instruction template: build it with "
        "presets.bge_icl_template(examples) and pass instruction_template=...; the per-task examples and "
        "instructions of its MTEB runs are not bundled (instructions=None); a query longer than max_length is cut "
        "by tokens here, by FlagICLModel after a decode round trip of the instruction and query",
    ),
)

_HUB_CACHE = re.compile(r"models--([^/\\]+?)--([^/\\]+)")


def preset_for_id(hub_id: str) -> Preset | None:
    """The preset whose Hub ids match ``hub_id`` (``org/name``), or None."""
    return next((preset for preset in PRESETS if preset.matches(hub_id)), None)


def is_adapter_stack(name_or_path: str) -> bool:
    """True for an adapter folder (peft ``adapter_config.json``) of a family whose loader stacks adapters on their
    base (LLM2Vec), and for such a family's Hub id."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() and not (path / "adapter_config.json").exists():
        return False
    found = resolve(name_or_path) if path.is_dir() or "/" in name_or_path else None
    return bool(found and found.preset.loader == "llm2vec")


def preset_named(family: str) -> Preset:
    """The preset of a family by name (``"GritLM"``, ``"e5-mistral-7b-instruct"`` ...)."""
    for preset in PRESETS:
        if preset.family.lower() == family.lower():
            return preset
    raise UnknownNameError(f"no preset {family!r}; known: {', '.join(p.family for p in PRESETS)}")


def resolve(name_or_path: str) -> Resolution | None:
    """The preset of a Hub id or a local folder (see the module doc); None for anything else."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return recognise(path)
    preset = preset_for_id(name_or_path)
    return Resolution(preset, name_or_path, "hub id") if preset else None


def recognise(folder: Path) -> Resolution | None:
    """Recognise a published family from a folder's files; None when nothing identifies one."""
    if (folder / STRATEGY_FILE).exists():
        return None
    cached = _HUB_CACHE.search(str(folder.resolve()))
    if cached:
        hub_id = f"{cached.group(1)}/{cached.group(2)}"
        preset = preset_for_id(hub_id)
        if preset:
            return Resolution(preset, hub_id, "Hugging Face cache path")
    for step in (_from_llm2vec_files, _from_adapter, _from_config, _from_folder_name):
        found = step(folder)
        if found:
            return found
    return None


def adapter_base(folder: Path) -> str | None:
    """``base_model_name_or_path`` of a folder's peft ``adapter_config.json``; None without one."""
    config = folder / "adapter_config.json"
    if not config.exists():
        return None
    base = read_json(config, error=ModelLoadError, what="adapter config").get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise ModelLoadError(f"{config}: no base_model_name_or_path (which model does this adapter extend?)")
    return base


def _from_llm2vec_files(folder: Path) -> Resolution | None:
    marker = folder / LLM2VEC_CONFIG
    base = adapter_base(folder)
    if not marker.exists() and not (base and Path(base).name.lower().startswith("llm2vec")):
        return None
    preset = preset_named("LLM2Vec")
    files = {"llm2vec_config.json": "present"} if marker.exists() else {}
    if base:
        files["adapter_config.json"] = f"base_model_name_or_path={base}"
    return Resolution(preset, None, "llm2vec_config.json" if marker.exists() else "adapter base", files)


#: The file llm2vec's ``LLM2Vec.save`` writes beside a model and ``LLM2Vec.from_pretrained`` reads its encoder
#: settings from (they override the class's defaults: mean pooling, the instruction skipped, 512 tokens).
LLM2VEC_CONFIG = "llm2vec_config.json"
#: llm2vec's pooling modes lmembed reproduces, as strategy options. Refused: ``eos_token``, which appends a
#: family-dependent text (" </s>", "<eos>", ...) whose tokenisation lmembed does not reproduce, and ``bos_token``,
#: which pools the BOS inside the instruction.
LLM2VEC_POOLING: dict[str, dict[str, Any]] = {
    "mean": {"pooling": "mean"},
    "weighted_mean": {"pooling": "weighted_mean"},  # weights 1..n over the pooled (text) tokens, as lmembed's
    "last_token": {"pooling": "last", "add_eos": False},  # the last text token, nothing appended
}
_LLM2VEC_KEYS = ("pooling_mode", "max_length", "doc_max_length", "skip_instruction")


def llm2vec_settings(folder: Path) -> dict[str, Any]:
    """The strategy options a folder's ``llm2vec_config.json`` sets (none without one), each checked: a setting
    lmembed does not reproduce is refused, naming the file and the key, rather than read with the preset's."""
    path = folder / LLM2VEC_CONFIG
    if not path.exists():
        return {}
    data = read_json(path, error=ModelLoadError, what="llm2vec config")
    if unknown := sorted(set(data) - set(_LLM2VEC_KEYS)):
        raise ModelLoadError(f"{path}: unknown key(s) {', '.join(unknown)}; llm2vec reads {', '.join(_LLM2VEC_KEYS)}")
    options: dict[str, Any] = {}
    mode = data.get("pooling_mode", "mean")
    if mode not in LLM2VEC_POOLING:
        raise ModelLoadError(
            f"{path}: pooling_mode={mode!r} is not one lmembed reproduces ({', '.join(LLM2VEC_POOLING)}); its "
            "vectors would differ from llm2vec's"
        )
    options.update(LLM2VEC_POOLING[mode])
    skip = data.get("skip_instruction", True)
    if not isinstance(skip, bool):
        raise ModelLoadError(f"{path}: skip_instruction={skip!r} must be true or false")
    if not skip:
        raise ModelLoadError(
            f"{path}: skip_instruction=false pools the instruction (and BOS) with the text, which lmembed does not "
            "reproduce: an instruction's tokens always stay out of its pooling"
        )
    for key in ("max_length", "doc_max_length"):
        value = data.get(key)
        if value is not None and (not is_whole_number(value) or value < 1):
            raise ModelLoadError(f"{path}: {key}={value!r} must be a whole number >= 1")
    if data.get("max_length") is not None:
        options["max_length"] = data["max_length"]
    return options


def _from_adapter(folder: Path) -> Resolution | None:
    base = adapter_base(folder)
    preset = preset_for_id(base) if base else None
    if preset is None:
        return None
    return Resolution(preset, base, "adapter_config.json base_model_name_or_path", {"adapter_config.json": base})


def _from_config(folder: Path) -> Resolution | None:
    config_file = folder / "config.json"
    if not config_file.exists():
        return None
    config = read_json(config_file, error=ModelLoadError, what="model config")
    architectures = config.get("architectures") or []
    for preset in PRESETS:
        hit = next((a for a in architectures if a in preset.architectures), None)
        if hit:
            return Resolution(preset, None, f"config.json architectures={hit}", {"config.json": hit})
    recorded = config.get("_name_or_path")
    preset = preset_for_id(recorded) if isinstance(recorded, str) else None
    if preset:
        return Resolution(preset, recorded, "config.json _name_or_path", {"config.json": recorded})
    return None


def warn_overrides(
    resolution: Resolution, given: Mapping[str, Any], strategy: Mapping[str, Any] | None = None
) -> list[str]:
    """Log one warning per option in ``given`` that overrides a different value of the preset (or of ``strategy``:
    the preset as the model's own files set it); returns them."""
    strategy = resolution.preset.strategy if strategy is None else strategy
    messages = [
        f"{key}={value!r} overrides {resolution.preset.family}'s published {key}={strategy[key]!r}; "
        "its vectors will not match the reference"
        for key, value in given.items()
        if key in strategy
        and _normal(strategy[key]) != _normal(value)
        and not _adds_examples(resolution.preset, key, value)
    ]
    for message in messages:
        log.warning(message)
    return messages


def _adds_examples(preset: Preset, key: str, value: Any) -> bool:
    """True for a template that only puts few-shot examples before the published one, where the reference does."""
    published = preset.strategy.get(key)
    return (
        preset.examples_before_template
        and key == "instruction_template"
        and isinstance(value, str)
        and isinstance(published, str)
        and value.endswith(published)
    )


def _normal(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _from_folder_name(folder: Path) -> Resolution | None:
    """A folder named as a published model (``GritLM-7B``, ``LLM2Vec-…-mntp``), as ``git clone`` of its Hub
    repository leaves it; only a model folder (``config.json`` or ``adapter_config.json``) counts."""
    if not ((folder / "config.json").exists() or (folder / "adapter_config.json").exists()):
        return None
    name = folder.resolve().name.lower()
    for preset in PRESETS:
        if any(fnmatchcase(name, pattern.lower().split("/", 1)[-1]) for pattern in preset.hub_ids):
            return Resolution(preset, None, f"folder name {folder.name}")
    return None


# ---------------------------------------------------------------------------------------------- the final token


def required_final_token(preset: Preset) -> str | None:
    """The token a family's reference ends every text with and last-token pooling reads: the preset's
    ``eos_token``, ``"eos"`` for the tokenizer's own EOS, None where the family needs none."""
    strategy = preset.strategy
    if strategy.get("pooling") != "last" or not strategy.get("add_eos"):
        return None
    token = strategy.get("eos_token")
    return token if isinstance(token, str) else "eos"


# ---------------------------------------------------------------------------------------------- encoders' prompts

#: the prompt names of mteb's ``model_prompts`` that are a side's prompt (the others name one task or task type)
_SIDE_PROMPTS = ("query", *DOCUMENT_PROMPT_NAMES)


@functools.lru_cache(maxsize=64)
def registry_prompts(hub_id: str) -> dict[str, str] | None:
    """The query/document prompts mteb's model registry records for ``hub_id`` (``ModelMeta.loader_kwargs
    ["model_prompts"]`` of a sentence-transformers loader: e5-base-v2's ``query: ``/``passage: ``, bge's retrieval
    instruction); None where mteb is not installed, does not know the model or records none. Offline: mteb's
    registry is part of the package. mteb (seconds to import) is imported only when its model files name the id."""
    if not _named_in_mteb(hub_id):
        return None
    try:
        import mteb  # lazy: an optional extra, slow to import
    except ImportError:
        return None
    try:
        meta = mteb.get_model_meta(hub_id)
    except Exception:  # not in mteb's registry (it raises ValueError/KeyError with close matches)
        return None
    kwargs = getattr(meta, "loader_kwargs", None) or {}
    prompts = kwargs.get("model_prompts") if isinstance(kwargs, dict) else None
    if not isinstance(prompts, dict):
        return None
    sides = {name: value for name, value in prompts.items() if name in _SIDE_PROMPTS and isinstance(value, str)}
    return sides if any(sides.values()) else None


def _named_in_mteb(hub_id: str) -> bool:
    """Whether mteb's model files (read as text, without importing mteb) mention ``hub_id`` at all."""
    try:
        spec = importlib.util.find_spec("mteb")
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None:
        return False
    needle = json.dumps(hub_id)
    files = (Path(spec.origin).parent / "models" / "model_implementations").glob("*.py")
    return any(needle in file.read_text(encoding="utf-8", errors="ignore") for file in files)


def hub_id_of(name_or_path: str, folder: Path | None = None) -> str | None:
    """The Hub id a model was published under: a Hub id as given, else from the Hugging Face cache path of the
    folder (or of ``folder``, the one holding its weights); None when nothing records one (a ``config.json``'s
    ``_name_or_path`` is not read: a fine-tuned model records its base there)."""
    path = Path(name_or_path).expanduser()
    if not path.exists():
        return name_or_path if name_or_path.count("/") == 1 else None
    for where in (path, folder):
        cached = _HUB_CACHE.search(str(Path(where).resolve())) if where is not None else None
        if cached:
            return f"{cached.group(1)}/{cached.group(2)}"
    return None


def add_registry_prompts(published: Any, name_or_path: str) -> bool:
    """Give a sentence-transformers folder that declares no prompts (``published``: a
    :class:`~lmembed.models.sentence_transformers_folder.PublishedModel`) the prompts mteb's model registry records
    for its Hub id, read as sentence-transformers reads prompts: prepended as they are (an instruction the caller
    passes too, never wrapped in lmembed's decoder template), pooled when its Pooling module's ``include_prompt``
    says so. Returns True when prompts were added."""
    if published.options.get("prompts"):
        return False
    hub_id = hub_id_of(name_or_path, getattr(published, "model_dir", None))
    prompts = registry_prompts(hub_id) if hub_id else None
    if not prompts:
        return False
    source = f"mteb model registry ({hub_id}: ModelMeta.loader_kwargs model_prompts)"
    published.decide("prompts", dict(prompts), source)
    published.decide("prompt_style", "sentence_transformers", source)
    published.decide("instruction_template", "{instruction}", source)
    published.decide("query_instruction", prompts.get("query") or None, source)
    document = next((prompts[name] for name in DOCUMENT_PROMPT_NAMES if prompts.get(name)), None)
    published.decide("document_instruction", document, source)
    include, where = _pooling_include_prompt(Path(published.root))
    published.decide("include_prompt", include, where)
    log.info("%s declares no prompts; using mteb's registry entry for %s: %s", published.root, hub_id, prompts)
    return True


def _pooling_include_prompt(root: Path) -> tuple[bool, str]:
    """The Pooling module's ``include_prompt`` (sentence-transformers' default: True) and the file that says it."""
    modules = root / "modules.json"
    entries = read_json(modules, error=ModelLoadError, what="module list", kind=list) if modules.is_file() else []
    for entry in entries:
        if isinstance(entry, dict) and str(entry.get("type", "")).endswith(".Pooling"):
            config = root / str(entry.get("path", "")) / "config.json"
            if config.is_file():
                value = read_json(config, error=ModelLoadError, what="Pooling config").get("include_prompt", True)
                return bool(value), str(config)
    return True, "sentence-transformers' default (include_prompt=True)"


# ---------------------------------------------------------------------------------------------- rerankers

#: Published rerankers' maximum lengths as their model cards use them (Hub id patterns, matched case-insensitively):
#: Qwen3-Reranker's card tokenises to max_length=8192; bge-reranker-v2-m3's (FlagReranker.compute_score) to 512,
#: where its tokenizer's model_max_length would say 8192.
RERANKER_MAX_LENGTHS: tuple[tuple[str, int], ...] = (
    ("qwen/qwen3-reranker-*", 8192),
    ("baai/bge-reranker-v2-m3", 512),
)


def reranker_max_length(name_or_path: str) -> int | None:
    """The maximum length a published reranker's model card uses (:data:`RERANKER_MAX_LENGTHS`), for a Hub id or a
    folder of the Hugging Face cache; None for others."""
    hub_id = hub_id_of(name_or_path)
    if hub_id is None:
        return None
    name = hub_id.strip().lower()
    return next((length for pattern, length in RERANKER_MAX_LENGTHS if fnmatchcase(name, pattern)), None)
