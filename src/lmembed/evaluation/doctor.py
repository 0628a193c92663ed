"""``lmembed doctor``: what strategy a model resolves to, who decided each field, and whether it really holds.

:func:`provenance` lists every strategy field with its value and its source: an option the user gave, the
folder's ``lmembed.json``, a sentence-transformers file of the folder (``modules.json``, a module's config,
``config_sentence_transformers.json``), a published family's preset (:mod:`lmembed.models.presets`), the model itself
(an encoder attends bidirectionally, its position limit caps ``max_length``) or lmembed's default.

:func:`run_checks` then runs invariance checks on the loaded model, each a :class:`Check` that passed, failed
or was skipped with the reason:

* ``attention``: a decoder is in the mode the strategy names, and a probe agrees (the first token's state
  moves with the last token exactly when attention is bidirectional);
* ``padding``: a text embedded alone equals the same text in a batch with longer and shorter ones, padded
  left and padded right;
* ``prompt-pooling``: for a mean-type pooling, the text tokens pooled (special tokens aside) do not change
  when the instruction does or when there is none, so prompt tokens stay out of the vector (skipped, with the
  reason, where a family's reference counts its masked prompt positions itself: NV-Embed, LLM2Vec);
* ``truncation``: a text longer than ``max_length`` still ends with the token a short text ends with (the
  EOS last-token pooling reads, an encoder's closing ``[SEP]``), within ``max_length``;
* ``final-token``: where the published family's reference ends every text with a token that last-token pooling
  reads (e5-mistral, SFR, bge-en-icl's ``</s>``, Qwen's ``<|endoftext|>``), the last token ids each sample text
  (a query with an instruction and a document) really ends with, whether the tokenizer put the token there or
  lmembed appended it, and a failure when it is missing (:func:`check_final_token`);
* ``sentence-transformers``: where the folder has ``modules.json`` and sentence-transformers is installed,
  the cosine of lmembed's vectors to ``SentenceTransformer(folder)``'s.

A Hub id needs no network to be resolved: :func:`preset_fields` gives a published family's conventions from its
preset alone and :func:`weights_here` says whether the Hugging Face cache holds the model, so ``lmembed doctor``
prints the conventions and says plainly that the weights are not here instead of failing on the connection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.config import EmbeddingConfig
from lmembed.embedder import Embedder
from lmembed.encoding.engine import resolve_max_length
from lmembed.encoding.inputs import InputBuilder
from lmembed.errors import ModelLoadError
from lmembed.io import read_json
from lmembed.load_spec import STRATEGY_FILE
from lmembed.models.attention import first_token_sensitivity
from lmembed.models.families import CAUSAL_TOLERANCE
from lmembed.models.presets import Resolution, required_final_token
from lmembed.pooling.normalize import unit_rows

#: Two vectors of the same text count as equal at or above this cosine.
EQUAL_COSINE = 0.9999
SAMPLE_TEXTS = (
    "A man is eating food.",
    "The cat sat on the mat while the dog slept on the rug by the door.",
    "Scurvy is caused by a lack of vitamin C in the diet, and sailors on long voyages suffered from it.",
    "hello",
)
SAMPLE_INSTRUCTION = "Given a question, retrieve passages that answer it"


@dataclass(frozen=True)
class Field:
    """One strategy field: its value and what decided it."""

    name: str
    value: Any
    source: str


@dataclass(frozen=True)
class Check:
    """One invariance check: ``passed`` is None when it was skipped (``detail`` says why)."""

    name: str
    passed: bool | None
    detail: str


def provenance(embedder: Embedder, given: Mapping[str, Any] | None = None) -> list[Field]:
    """Every field of the embedder's strategy with the file, preset, option or default that decided it."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    saved = _saved_strategy(embedder.backbone.path)
    published = embedder.published
    folder_sources = getattr(getattr(embedder, "published_folder", None), "sources", None) or {}
    folder_sources = {**folder_sources, **(getattr(embedder, "checkpoint_sources", None) or {})}
    defaults = EmbeddingConfig()
    out = []
    for item in fields(EmbeddingConfig):
        name = item.name
        value = getattr(embedder.config, name)
        if name in given:
            source = "option"
        elif saved is not None and name in saved:
            source = f"{Path(embedder.backbone.path) / STRATEGY_FILE}"
        elif name in folder_sources:
            source = folder_sources[name]  # the sentence-transformers file that decided it
        elif published and name in published.preset.strategy:
            source = f"preset {published.preset.family} ({published.reason})"
        elif name == "attention" and not embedder.backbone.is_decoder:
            source = "model (an encoder attends bidirectionally)"
        elif name == "max_length" and value != getattr(defaults, name):
            source = "model (its sequence limit, at most 512)"
        else:
            source = "lmembed default"
        out.append(Field(name, value.label() if hasattr(value, "label") else value, source))
    return out


def _saved_strategy(path: str) -> dict[str, Any] | None:
    file = Path(path) / STRATEGY_FILE if path else None
    if file is None or not file.exists():
        return None
    strategy = read_json(file, error=ModelLoadError, what="saved strategy record").get("strategy")
    return strategy if isinstance(strategy, dict) else None


# ---------------------------------------------------------------------------------------------- checks


def run_checks(embedder: Embedder, texts: Sequence[str] = SAMPLE_TEXTS) -> list[Check]:
    """Every check of the module doc, in order; an error inside a check fails that check."""
    checks: list[tuple[str, Callable[[Embedder, Sequence[str]], Check]]] = [
        ("attention", check_attention),
        ("padding", check_padding),
        ("prompt-pooling", check_prompt_pooling),
        ("truncation", check_truncation),
        ("final-token", check_final_token),
        ("sentence-transformers", check_sentence_transformers),
    ]
    results = []
    embedder = embedder.without_cache()  # every vector is computed: a cached one would hide what is checked
    for name, check in checks:
        try:
            results.append(check(embedder, texts))
        except Exception as exc:  # a check that cannot run on this model has failed, with the reason
            results.append(Check(name, False, f"{type(exc).__name__}: {exc}"))
    return results


def check_attention(embedder: Embedder, texts: Sequence[str]) -> Check:
    backbone = embedder.backbone
    if not backbone.is_decoder:
        return Check("attention", None, "an encoder: always bidirectional")
    mode = embedder.config.attention
    embedder.encode(list(texts[:1]))  # puts the model in the strategy's mode, as every encode does
    change = first_token_sensitivity(backbone.model, mode)
    moved = change > CAUSAL_TOLERANCE
    ok = moved == (mode == "bidirectional")
    return Check("attention", ok, f"{mode}: the first token's state moves by {change:.2e} when the last token changes")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (unit_rows(a, dtype=None) * unit_rows(b, dtype=None)).sum(1)


def check_padding(embedder: Embedder, texts: Sequence[str]) -> Check:
    engine = embedder.engine
    alone = np.stack([embedder.encode([t]) for t in texts]).squeeze(1)
    original = engine.padding_side
    worst = {}
    try:
        for side in ("left", "right"):
            engine.padding_side = side
            worst[side] = float(_cosines(embedder.encode(list(texts)), alone).min())
    finally:
        engine.padding_side = original
    ok = min(worst.values()) >= EQUAL_COSINE
    detail = ", ".join(f"padded {side}: lowest cosine {value:.6f}" for side, value in worst.items())
    return Check("padding", ok, f"a text alone vs in a batch: {detail}")


def _builder(embedder: Embedder, config: EmbeddingConfig | None = None) -> InputBuilder:
    cfg = config or embedder.config
    limit = resolve_max_length(embedder.backbone, cfg.max_length)  # the engine's limit: the model's positions too
    return InputBuilder(embedder.backbone.tokenizer, cfg, is_decoder=embedder.backbone.is_decoder, max_length=limit)


def _pooled_ids(builder: InputBuilder, text: str, instruction: str | None) -> list[int]:
    """The ids of the pooled tokens that are not special tokens (whether a [CLS] or BOS before the text counts
    is the pooling's own convention, not the prompt's)."""
    features = builder.build(text, instruction)
    special = set(builder.tokenizer.all_special_ids)
    return [i for i, m in zip(features.input_ids, features.pool_mask, strict=True) if m and i not in special]


def check_prompt_pooling(embedder: Embedder, texts: Sequence[str]) -> Check:
    cfg = embedder.config
    if cfg.pooling in ("cls", "last"):
        return Check("prompt-pooling", None, f"{cfg.pooling} pooling reads one token, not the prompt's")
    if getattr(cfg, "include_prompt", False):
        return Check("prompt-pooling", None, "the model pools its prompt tokens too (include_prompt)")
    builder = _builder(embedder)
    text = texts[1]
    variants = {"an instruction": SAMPLE_INSTRUCTION, "another instruction": "Classify it", "no instruction": None}
    pooled = {label: _pooled_ids(builder, text, instruction) for label, instruction in variants.items()}
    reference = pooled["no instruction"]
    differ = [label for label, ids in pooled.items() if ids != reference]
    counted = {  # NV-Embed and LLM2Vec: the masked positions are counted as their code counts them, on purpose
        "token_count": "leaves out len(tokenizer.tokenize(prompt)) positions (instruction_mask='token_count')",
        "text_tokens": "keeps the last len(tokenizer(text)) positions (instruction_mask='text_tokens')",
    }
    if differ and cfg.instruction_mask in counted:
        detail = (
            f"the pooled tokens change with {', '.join(differ)}, as in the reference: its pool mask "
            f"{counted[cfg.instruction_mask]}, not the prompt's own tokens"
        )
        return Check("prompt-pooling", None, detail)
    if differ:
        return Check("prompt-pooling", False, f"the pooled tokens change with {', '.join(differ)}")
    detail = f"the same {len(reference)} text tokens pooled with and without an instruction"
    return Check("prompt-pooling", True, detail)


def check_truncation(embedder: Embedder, texts: Sequence[str]) -> Check:
    cfg = embedder.config
    builder = _builder(embedder)
    limit = builder.max_length
    short = builder.build(texts[0])
    tokenizer = embedder.backbone.tokenizer
    suffix_ids = set(tokenizer.all_special_ids)
    last = short.input_ids[-1]
    if last not in suffix_ids:
        return Check("truncation", None, "a short text ends with no special token, so there is none to keep")
    words = (" ".join(texts) + " ").split()
    long_text = " ".join(words * (limit // max(len(words), 1) + 2))
    long = builder.build(long_text)
    name = tokenizer.convert_ids_to_tokens(last)
    ok = len(long) <= limit and long.input_ids[-1] == last and (cfg.pooling != "last" or long.pool_mask[-1] == 1)
    return Check("truncation", ok, f"a {len(long)}-token cut of a longer text (max_length {limit}) ends with {name!r}")


def check_sentence_transformers(embedder: Embedder, texts: Sequence[str]) -> Check:
    folder = Path(embedder.backbone.path) if embedder.backbone.path else None
    if folder is None or not (folder / "modules.json").exists():
        return Check("sentence-transformers", None, "no modules.json: not a sentence-transformers folder")
    try:
        from sentence_transformers import SentenceTransformer  # lazy: an optional extra
    except ImportError:
        return Check("sentence-transformers", None, "sentence-transformers is not installed")
    model = SentenceTransformer(str(folder), device=str(embedder.backbone.device))
    prompts = getattr(embedder.config, "prompts", None) or {}  # the folder's named prompts, each compared too
    lowest: dict[str, float] = {}
    for name in [None, *sorted(p for p in prompts if prompts[p])]:
        theirs = np.asarray(model.encode(list(texts), prompt_name=name, convert_to_numpy=True), dtype=np.float32)
        ours = embedder.encode(list(texts), prompt_name=name) if name else embedder.encode(list(texts))
        label = f"prompt {name!r}" if name else "no prompt"
        if theirs.shape != ours.shape:
            detail = f"{label}: shapes differ: lmembed {ours.shape}, sentence-transformers {theirs.shape}"
            return Check("sentence-transformers", False, detail)
        lowest[label] = float(_cosines(ours, theirs).min())
    detail = ", ".join(f"{label} {value:.6f}" for label, value in lowest.items())
    ok = min(lowest.values()) >= EQUAL_COSINE
    return Check("sentence-transformers", ok, f"lowest cosine to SentenceTransformer: {detail}")


def _required_final_id(embedder: Embedder) -> tuple[int, str] | None:
    """(id, token) of the token the published family's reference ends every text with; None where it needs none."""
    published = embedder.published
    token = required_final_token(published.preset) if published else None
    if token is None:
        return None
    tokenizer = embedder.backbone.tokenizer
    if token == "eos":
        if tokenizer.eos_token_id is None:
            raise ValueError("the preset ends every text with the tokenizer's EOS, and this tokenizer has none")
        return tokenizer.eos_token_id, str(tokenizer.eos_token)
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(f"the preset ends every text with {token!r}, which is not in this tokenizer's vocabulary")
    return token_id, token


def final_token_ids(embedder: Embedder, text: str, instruction: str | None, tail: int = 3) -> tuple[list[int], bool]:
    """The last ``tail`` token ids lmembed feeds for ``text`` (a query with ``instruction``, or a document), and
    whether the tokenizer itself ended the text with the same token (False: lmembed appended it, or nothing did)."""
    builder = _builder(embedder)
    features = builder.build(text, instruction)
    wrapped = builder._prefix(text, instruction)[0] + text + builder._suffix(instruction) if instruction else text
    own = embedder.backbone.tokenizer(wrapped, add_special_tokens=True)["input_ids"]
    return features.input_ids[-tail:], bool(own) and own[-1] == features.input_ids[-1]


def check_final_token(embedder: Embedder, texts: Sequence[str]) -> Check:
    """The published family's final token ends every sample text (a query with an instruction and the documents),
    with the last token ids each really ends with."""
    required = _required_final_id(embedder)
    if required is None:
        return Check("final-token", None, "the model's reference reads no required final token")
    token_id, token = required
    config = embedder.config
    samples = [(texts[0], config.query_instruction or SAMPLE_INSTRUCTION), *((t, None) for t in texts[1:])]
    parts, missing = [], []
    for text, instruction in samples:
        ids, by_tokenizer = final_token_ids(embedder, text, instruction)
        label = f"{'query' if instruction else 'text'} {text[:24]!r}"
        ok = ids[-1] == token_id
        how = ("put there by the tokenizer" if by_tokenizer else "appended by lmembed") if ok else "MISSING"
        parts.append(f"{label} ends with ids {ids} ({how})")
        if not ok:
            missing.append(label)
    expected = f"the reference ends every text with {token!r} (id {token_id})"
    if missing:
        return Check("final-token", False, f"{expected}, missing after {', '.join(missing)}: {'; '.join(parts)}")
    return Check("final-token", True, f"{expected}: {'; '.join(parts)}")


# ---------------------------------------------------------------------------------------------- offline


def preset_fields(resolution: Resolution, given: Mapping[str, Any] | None = None) -> list[Field]:
    """Every strategy field a published family's preset decides (with ``given`` options over it), without loading
    anything: what ``lmembed doctor`` shows for a Hub id whose weights are not on this machine."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    preset = resolution.preset
    config = preset.config(**given)
    out = []
    for item in fields(EmbeddingConfig):
        name = item.name
        value = getattr(config, name)
        if name in given:
            source = "option"
        elif name in preset.strategy:
            source = f"preset {preset.family} ({resolution.reason})"
        elif name == "max_length":
            source = "the model (its sequence limit): not known until it is loaded"
        else:
            source = "lmembed default"
        out.append(Field(name, value.label() if hasattr(value, "label") else value, source))
    return out


def weights_here(hub_id: str) -> bool:
    """True when the Hugging Face cache holds ``hub_id``'s ``config.json`` (or an adapter's
    ``adapter_config.json``); looked up on disk only, never on the network."""
    try:
        from huggingface_hub import try_to_load_from_cache  # lazy: only for a Hub id
    except ImportError:  # pragma: no cover - transformers depends on it
        return False
    for filename in ("config.json", "adapter_config.json"):
        try:
            found = try_to_load_from_cache(hub_id, filename)
        except Exception:  # a malformed id: nothing of it can be cached
            return False
        if isinstance(found, str):
            return True
    return False
