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
  reason, where a family's reference counts its masked prompt positions itself: NV-Embed);
* ``truncation``: a text longer than ``max_length`` still ends with the token a short text ends with (the
  EOS last-token pooling reads, an encoder's closing ``[SEP]``), within ``max_length``;
* ``sentence-transformers``: where the folder has ``modules.json`` and sentence-transformers is installed,
  the cosine of lmembed's vectors to ``SentenceTransformer(folder)``'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from lmembed.config import EmbeddingConfig
from lmembed.embedder import STRATEGY_FILE, Embedder
from lmembed.encoding.engine import resolve_max_length
from lmembed.encoding.inputs import InputBuilder
from lmembed.models.attention import first_token_sensitivity
from lmembed.models.families import CAUSAL_TOLERANCE

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
    strategy = json.loads(file.read_text()).get("strategy")
    return strategy if isinstance(strategy, dict) else None


# ---------------------------------------------------------------------------------------------- checks


def run_checks(embedder: Embedder, texts: Sequence[str] = SAMPLE_TEXTS) -> list[Check]:
    """Every check of the module doc, in order; an error inside a check fails that check."""
    checks: list[tuple[str, Callable[[Embedder, Sequence[str]], Check]]] = [
        ("attention", check_attention),
        ("padding", check_padding),
        ("prompt-pooling", check_prompt_pooling),
        ("truncation", check_truncation),
        ("sentence-transformers", check_sentence_transformers),
    ]
    results = []
    use_cache = embedder.engine.use_cache
    embedder.engine.use_cache = False  # every vector is computed: a cached one would hide what is checked
    try:
        for name, check in checks:
            try:
                results.append(check(embedder, texts))
            except Exception as exc:  # a check that cannot run on this model has failed, with the reason
                results.append(Check(name, False, f"{type(exc).__name__}: {exc}"))
    finally:
        embedder.engine.use_cache = use_cache
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
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


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
    if differ and cfg.instruction_mask == "token_count":  # NV-Embed: counted as its code counts, on purpose
        detail = (
            f"the pooled tokens change with {', '.join(differ)}, as in the reference: its pool mask leaves out "
            "len(tokenizer.tokenize(prompt)) positions (instruction_mask='token_count'), not the prompt's own tokens"
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
