"""EmbeddingConfig's fields each declare their group, and the cache keys are built from those declarations.

A field with no group (or one whose change does not move the fingerprint although it is a forward or pooling
field) would put different vectors under one cache key: these tests fail for it. The fingerprints below were
computed with the hand-written ``forward_key``/``pooling_key`` before the keys were derived, so existing caches,
indexes and jobs keep their keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any

import pytest

from lmembed.config import (
    FIELD_GROUPS,
    ST_ANY,
    ST_BY_EMBEDDER,
    EmbeddingConfig,
    _field,
    field_group,
    sentence_transformers_expressible,
)
from lmembed.embedder import Embedder
from lmembed.models.sentence_transformers_folder import ST_POOLING_MODES

#: name -> (strategy, fingerprint with the keys written by hand, before they were derived)
PINNED: dict[str, tuple[dict[str, Any], str]] = {
    "default": ({}, "f886e058074e7a33"),
    "last_bidir_echo": (
        {"pooling": "last", "attention": "bidirectional", "echo": True, "max_length": 64, "add_eos": True},
        "ba6ae0fc163ab44c",
    ),
    "latent": (
        {
            "pooling": "latent_attention",
            "layer": (-2, -1),
            "final_norm": False,
            "latent": {"num_latents": 4, "num_heads": 2},
        },
        "a4acb62d2e709486",
    ),
    "latent_nv": (
        {
            "pooling": "latent_attention",
            "latent": {"num_latents": 4, "num_heads": 2, "variant": "nv-embed", "head_dim": 8},
        },
        "357c531288c48fe2",
    ),
    "st_weighted": (
        {
            "pooling": "weighted_mean",
            "prompt_style": "sentence_transformers",
            "include_prompt": True,
            "lowercase": True,
            "prompts": {"query": "q: "},
            "default_prompt_name": "query",
        },
        "cdfa928946eda691",
    ),
    "optional": (
        {
            "pooling": "cls",
            "plain_prefix": "<s>",
            "instruction_suffix": "\n<r>",
            "pool_special_tokens": False,
            "eos_token": "</s>",
            "instruction_mask": "text_tokens",
            "instruction_template": "I: {instruction} Q: ",
            "echo_template": "R {text} R",
        },
        "3084f70284154662",
    ),
    "head": (
        {
            "pooling": "mean",
            "head": ({"type": "normalize", "route": "query"},),
            "route": "query",
            "normalize": False,
            "dim": 8,
            "similarity": "dot",
            "query_instruction": "q",
            "document_instruction": "d",
        },
        "9abe0844284c2e3e",
    ),
    "max": ({"pooling": "max", "layer": 3, "final_norm": True}, "c662c2ced93e5656"),
    "terms": (
        {"terms": {"dims": 64, "weight": 0.5, "avg_length": 12.0, "sha256": "0" * 64}, "route": "query"},
        "a4c41f6c581019cd",
    ),
}

#: For each field, a base strategy and a changed value: a forward or pooling field must move the fingerprint, an
#: output or prompt field must not. A new field must be added here too (a test checks every field is covered).
CHANGES: dict[str, tuple[dict[str, Any], Any]] = {
    "pooling": ({}, "cls"),
    "layer": ({}, -2),
    "final_norm": ({}, True),
    "attention": ({}, "bidirectional"),
    "echo": ({}, True),
    "echo_template": ({"echo": True}, "again {text} again"),
    "instruction_template": ({}, "Task: {instruction}\n"),
    "query_instruction": ({}, "find it"),
    "plain_prefix": ({}, "<p>"),
    "instruction_suffix": ({}, "<r>"),
    "pool_special_tokens": ({}, False),
    "instruction_mask": ({}, "token_count"),
    "add_eos": ({}, True),
    "eos_token": ({}, "</s>"),
    "max_length": ({}, 32),
    "normalize": ({}, False),
    "dim": ({}, 4),
    "latent": ({"pooling": "latent_attention"}, {"num_latents": 3, "num_heads": 1}),
    "prompt_style": ({}, "sentence_transformers"),
    "include_prompt": ({}, True),
    "prompts": ({}, {"query": "q: "}),
    "default_prompt_name": ({"prompts": {"query": "q: "}}, "query"),
    "document_instruction": ({}, "passage: "),
    "lowercase": ({}, True),
    "similarity": ({}, "dot"),
    "head": ({}, ({"type": "normalize"},)),
    "route": ({"head": ({"type": "normalize", "route": "query"},)}, "query"),
    "terms": ({}, {"dims": 64, "weight": 0.5, "avg_length": 12.0, "sha256": "0" * 64}),
}


def unplaced_fields(config_class: type) -> list[str]:
    """The fields of ``config_class`` that declare no group of :data:`FIELD_GROUPS`."""
    return [f.name for f in fields(config_class) if field_group(f) not in FIELD_GROUPS]


def test_every_field_declares_a_group():
    assert unplaced_fields(EmbeddingConfig) == []


def test_a_field_without_a_group_is_caught():
    @dataclass(frozen=True)
    class WithNewField(EmbeddingConfig):
        new_knob: int = 0  # a field added without _field(group, ...)

    @dataclass(frozen=True)
    class WithPlacedField(EmbeddingConfig):
        new_knob: int = _field("forward", 0)

    assert unplaced_fields(WithNewField) == ["new_knob"]
    assert unplaced_fields(WithPlacedField) == []
    placed = WithPlacedField(new_knob=3)
    assert placed.forward_key()["new_knob"] == 3
    assert placed.fingerprint() != WithPlacedField().fingerprint()


def test_an_unknown_group_is_refused():
    with pytest.raises(ValueError, match="group='misc'"):
        _field("misc", 0)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_fingerprints_are_those_of_the_hand_written_keys(name):
    strategy, fingerprint = PINNED[name]
    assert EmbeddingConfig(**strategy).fingerprint() == fingerprint


def test_every_field_has_a_change_case():
    assert sorted(CHANGES) == sorted(f.name for f in fields(EmbeddingConfig))


@pytest.mark.parametrize("f", fields(EmbeddingConfig), ids=lambda f: f.name)
def test_a_field_moves_the_fingerprint_exactly_when_its_group_is_keyed(f: dataclasses.Field[Any]):
    base, value = CHANGES[f.name]
    before = EmbeddingConfig(**base)
    after = before.with_options(**{f.name: value})
    assert after != before
    keyed = field_group(f) in ("forward", "pooling")
    assert (after.fingerprint() != before.fingerprint()) is keyed, (f.name, field_group(f))


#: The fields sentence-transformers reproduces whatever their value (written to its files, or unused once the other
#: rules hold). A new field lands here by default: this pin makes its author decide.
ST_ANY_FIELDS = {
    "echo_template",
    "instruction_template",
    "query_instruction",
    "instruction_mask",
    "max_length",
    "normalize",
    "latent",
    "prompt_style",
    "include_prompt",
    "prompts",
    "default_prompt_name",
    "document_instruction",
    "lowercase",
    "similarity",
    "route",
}


def test_every_field_declares_how_sentence_transformers_reproduces_it():
    rules = {f.name: f.metadata["st"] for f in fields(EmbeddingConfig)}
    assert {name for name, rule in rules.items() if rule == ST_ANY} == ST_ANY_FIELDS
    assert all(rule in (ST_ANY, ST_BY_EMBEDDER) or callable(rule) for rule in rules.values())


@pytest.mark.parametrize("f", fields(EmbeddingConfig), ids=lambda f: f.name)
def test_a_field_with_a_config_rule_decides_sentence_transformers_compatibility(f: dataclasses.Field[Any]):
    base, value = CHANGES[f.name]
    if f.name == "head":
        value = ({"type": "normalize", "route": "query"},)
    before = sentence_transformers_expressible(EmbeddingConfig(**base))
    changed = EmbeddingConfig(**base).with_options(**{f.name: value})
    if callable(f.metadata["st"]):
        assert before and not sentence_transformers_expressible(changed)
    else:  # the change is invisible to the config-only rules
        assert sentence_transformers_expressible(changed) is before


def _compatible_as_written_by_hand(cfg: EmbeddingConfig, is_decoder: bool) -> bool:
    """Embedder.sentence_transformers_compatible as it was before the rules moved onto the fields."""
    uses_eos = cfg.add_eos if cfg.add_eos is not None else is_decoder and cfg.pooling == "last"
    return (
        cfg.pooling in ST_POOLING_MODES
        and cfg.layers == (-1,)
        and cfg.final_norm is None
        and not cfg.echo
        and not (is_decoder and cfg.attention == "bidirectional")
        and not uses_eos
        and cfg.dim is None
        and not cfg.plain_prefix
        and not cfg.instruction_suffix
        and cfg.pool_special_tokens
        and not any(layer.get("route") for layer in cfg.head)
        and cfg.terms is None  # added with the term channel: sentence-transformers has no such module
    )


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize("name", sorted(CHANGES))
def test_sentence_transformers_compatibility_is_unchanged(name, is_decoder, monkeypatch):
    """The rules that moved onto the fields give what the hand-written rule gave. (Whether sentence-transformers
    leaves out of pooling what lmembed leaves out for a prompt needs the tokenizer: test_saved_prompts.py.)"""
    import lmembed.embedder

    monkeypatch.setattr(lmembed.embedder, "_prompts_pool_as_sentence_transformers", lambda embedder: True)
    base, value = CHANGES[name]
    for cfg in (EmbeddingConfig(**base), EmbeddingConfig(**base).with_options(**{name: value})):
        for pooling in ("mean", "last", "latent_attention") if not cfg.head else ("mean",):
            cfg = cfg.with_options(pooling=pooling)
            embedder = SimpleNamespace(config=cfg, backbone=SimpleNamespace(is_decoder=is_decoder))
            expected = _compatible_as_written_by_hand(cfg, is_decoder)
            assert Embedder.sentence_transformers_compatible(embedder) is expected, (name, pooling)
