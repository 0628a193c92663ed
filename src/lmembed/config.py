"""The extraction strategy: one config object that says how a text becomes a vector.

Everything that changes an embedding (apart from the weights) lives here, so that a strategy can be
saved next to a model, compared in a grid, and used as part of the embedding-cache key. It
round-trips through JSON (``to_dict`` / ``from_dict``).

The fields fall into three groups, which the encoding engine treats differently:

* forward fields (``attention``, ``echo``, ``max_length`` ...) change the transformer's input or
  mask, so strategies that differ in them need separate forward passes;
* pooling fields (``pooling``, ``layer``, ``final_norm`` ...) only read hidden states, so one
  forward pass serves any number of them;
* output fields (``normalize``, ``dim``) are applied after pooling and after the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from lmembed.errors import ConfigError

POOLINGS = ("cls", "mean", "last", "weighted_mean", "max", "mean_sqrt_len", "latent_attention")
ATTENTIONS = ("causal", "bidirectional")
PROMPT_STYLES = ("lmembed", "sentence_transformers")
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")
HEAD_LAYERS = {
    # type -> (required keys, optional keys); the weights of dense/layer_norm live in the model folder at ``path``
    "dense": ({"in_features", "out_features", "path"}, {"bias", "activation", "residual", "route"}),
    "layer_norm": ({"dimension", "path"}, {"eps", "route"}),
    "normalize": (set(), {"route"}),
}
ACTIVATIONS = ("identity", "tanh", "relu", "gelu", "sigmoid", "silu")

POOLING_HELP = {
    "cls": "the first token's state (BERT's [CLS]); meaningful for encoders trained with it.",
    "mean": "the average of the token states (instruction and echo-prefix tokens left out).",
    "last": "the last real token's state (an EOS token is appended where the tokenizer adds none); "
    "the usual choice for causal decoders, correct under left and right padding.",
    "weighted_mean": "a position-weighted average, later tokens weigh more (SGPT); suits causal decoders.",
    "max": "the element-wise maximum over the token states (sentence-transformers' max pooling).",
    "mean_sqrt_len": "the sum of the token states divided by the square root of their number "
    "(sentence-transformers' mean_sqrt_len_tokens).",
    "latent_attention": "NV-Embed's trainable head: token states attend to a learned latent array, "
    "then an MLP and a mean; untrained until you train it.",
}
ATTENTION_HELP = {
    "causal": "each token sees only the tokens before it (a decoder's native mode).",
    "bidirectional": "the causal mask is removed so every token sees the whole text (LLM2Vec, NV-Embed); "
    "encoders always attend this way.",
}

DEFAULT_INSTRUCTION_TEMPLATE = "Instruct: {instruction}\nQuery: "
DEFAULT_ECHO_TEMPLATE = "Rewrite the sentence: {text}\nRewritten sentence: "

LayerSpec = int | tuple[int, ...]


def unknown_options(config_class: type, options: Mapping[str, Any]) -> list[str]:
    """The keys of ``options`` that name no field of the dataclass ``config_class``, sorted."""
    return sorted(set(options) - {f.name for f in fields(config_class)})


#: The plain field types :func:`mistyped_options` checks, and the values each accepts.
_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "str": (str, os.PathLike),
}


def mistyped_options(config_class: type, options: Mapping[str, Any]) -> list[str]:
    """``"steps: expected int, got 'many'"`` for each value of ``options`` (a YAML mapping, say) whose field in the
    dataclass ``config_class`` is declared a plain ``int``, ``float``, ``bool`` or ``str`` (or one of those
    ``| None``) and that is not one; fields of other types are left to the class."""
    declared = {f.name: f.type for f in fields(config_class) if isinstance(f.type, str)}
    problems = []
    for name, value in options.items():
        parts = [part.strip() for part in declared.get(name, "").split("|")]
        optional = "None" in parts
        plain = [part for part in parts if part != "None"]
        if len(plain) != 1 or plain[0] not in _PLAIN_TYPES or (value is None and optional):
            continue
        is_bool_for_number = isinstance(value, bool) and plain[0] != "bool"
        if is_bool_for_number or not isinstance(value, _PLAIN_TYPES[plain[0]]):
            hint = " (YAML reads 2e-5 as text: write 2.0e-5)" if plain[0] == "float" and _numeric_text(value) else ""
            problems.append(f"{name}: expected {plain[0]}{' or null' if optional else ''}, got {value!r}{hint}")
    return problems


def _numeric_text(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


@dataclass(frozen=True)
class LatentAttentionConfig:
    """Shape of a latent-attention pooling head.

    ``variant="lmembed"`` is lmembed's own trainable head (:mod:`lmembed.pooling.latent_attention`);
    ``"nv-embed"`` is the head of NV-Embed's published checkpoints (:mod:`lmembed.pooling.nvembed_latent`), whose
    attention heads are ``head_dim`` wide and whose GEGLU feed-forward is ``hidden_mult`` times the model width.
    """

    num_latents: int = 512
    num_heads: int = 8
    hidden_mult: int = 1  # MLP width as a multiple of the model width
    variant: str = "lmembed"
    head_dim: int | None = None  # nv-embed: the width of one attention head (None: hidden size / num_heads)

    def __post_init__(self) -> None:
        if self.variant not in LATENT_VARIANTS:
            raise ConfigError(f"latent variant={self.variant!r} is unknown; choose one of {', '.join(LATENT_VARIANTS)}")

    def key(self) -> dict[str, Any]:
        """The fields as a dict, the ones added later only where set (earlier strategies keep their fingerprints)."""
        data = asdict(self)
        for name, default in (("variant", "lmembed"), ("head_dim", None)):
            if data[name] == default:
                del data[name]
        return data


LATENT_VARIANTS = ("lmembed", "nv-embed")
INSTRUCTION_MASKS = ("offsets", "token_count", "text_tokens")


@dataclass(frozen=True)
class EmbeddingConfig:
    """How to turn a text into a vector with a given backbone.

    ``layer`` indexes the backbone's hidden states as transformers returns them: 0 is the
    embedding layer, ``-1`` the final output (after the final norm in decoders). A tuple of layers
    is averaged ("fused"). ``final_norm=True`` applies the decoder's final norm to whichever layer
    is read, ``False`` reads raw residual-stream states even for the last layer, ``None`` keeps
    transformers' convention.
    """

    pooling: str = "mean"
    layer: LayerSpec = -1
    final_norm: bool | None = None
    attention: str = "causal"
    echo: bool = False
    echo_template: str = DEFAULT_ECHO_TEMPLATE
    instruction_template: str = DEFAULT_INSTRUCTION_TEMPLATE
    query_instruction: str | None = None
    plain_prefix: str = ""  # put before a text embedded without an instruction, kept out of pooling (GritLM)
    # put after a text embedded with an instruction, pooled with the text (bge-en-icl's "\n<response>", whose end
    # last-token pooling reads)
    instruction_suffix: str = ""
    pool_special_tokens: bool = True  # False: special tokens (BOS, ...) never pooled, as LLM2Vec's embed mask
    # which tokens an instruction keeps out of pooling: "offsets" those before the text (by character offsets),
    # "token_count" the first len(tokenizer.tokenize(prefix)) tokens of the sequence, BOS included (NV-Embed)
    # "text_tokens": only the last len(text tokenised alone) tokens are pooled (LLM2Vec's embed mask)
    instruction_mask: str = "offsets"
    add_eos: bool | None = None
    eos_token: str | None = None  # the token appended for last-token pooling; None: the tokenizer's EOS
    max_length: int | None = None  # None: the model's own limit (at most 512), resolved on load
    normalize: bool = True
    dim: int | None = None
    latent: LatentAttentionConfig = field(default_factory=LatentAttentionConfig)
    # --- a published model's own conventions (read from its folder; see lmembed.models.sentence_transformers_folder)
    prompt_style: str = "lmembed"
    include_prompt: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    document_instruction: str | None = None
    lowercase: bool = False
    similarity: str = "cosine"
    head: tuple[dict[str, Any], ...] = ()
    route: str | None = None

    def __hash__(self) -> int:  # prompts and head are dicts: hash the JSON form (equal configs, equal hashes)
        return hash(self.to_json())

    def __post_init__(self) -> None:
        if isinstance(self.layer, list):
            object.__setattr__(self, "layer", tuple(self.layer))
        if isinstance(self.latent, dict):
            object.__setattr__(self, "latent", LatentAttentionConfig(**self.latent))
        if isinstance(self.head, list):
            object.__setattr__(self, "head", tuple(dict(layer) for layer in self.head))
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        if self.pooling not in POOLINGS:
            raise ConfigError(f"pooling={self.pooling!r} is unknown; choose one of {', '.join(POOLINGS)}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"attention={self.attention!r} is unknown; choose one of {', '.join(ATTENTIONS)}")
        layers = self.layers
        if not layers or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
            raise ConfigError(f"layer={self.layer!r} must be an int or a non-empty list of ints")
        if self.max_length is not None and self.max_length < 8:
            raise ConfigError(f"max_length={self.max_length} is too small (need at least 8 tokens)")
        if self.dim is not None and self.dim < 1:
            raise ConfigError(f"dim={self.dim} must be a positive int or None")
        if "{text}" not in self.echo_template:
            raise ConfigError("echo_template must contain '{text}' (the first copy of the input)")
        if self.instruction_mask not in INSTRUCTION_MASKS:
            raise ConfigError(
                f"instruction_mask={self.instruction_mask!r} is unknown; choose one of {', '.join(INSTRUCTION_MASKS)}"
            )
        if "{instruction}" not in self.instruction_template:
            raise ConfigError("instruction_template must contain '{instruction}'")
        self._validate_conventions()

    def _validate_conventions(self) -> None:
        if self.prompt_style not in PROMPT_STYLES:
            raise ConfigError(
                f"prompt_style={self.prompt_style!r} is unknown; choose one of {', '.join(PROMPT_STYLES)}"
            )
        if self.similarity not in SIMILARITIES:
            raise ConfigError(f"similarity={self.similarity!r} is unknown; choose one of {', '.join(SIMILARITIES)}")
        if not isinstance(self.prompts, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.prompts.items()
        ):
            raise ConfigError("prompts must map prompt names to prompt strings")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise ConfigError(
                f"default_prompt_name={self.default_prompt_name!r} is not one of the prompts "
                f"({', '.join(sorted(self.prompts)) or 'none'})"
            )
        if self.instruction_suffix and self.prompt_style != "lmembed":
            raise ConfigError("instruction_suffix needs prompt_style='lmembed' (sentence-transformers prompts prefix)")
        for i, layer in enumerate(self.head):
            validate_head_layer(layer, f"head[{i}]")
        if self.head and self.pooling == "latent_attention":
            raise ConfigError("a post-pooling head cannot follow pooling='latent_attention'")

    def named_prompt(self, name: str | None) -> str | None:
        """The prompt called ``name`` (None: the default prompt, if the model has one); an unknown name is a
        :class:`ConfigError` listing the known ones."""
        if name is None:
            name = self.default_prompt_name
            if name is None:
                return None
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none: the model declares no prompts"
            raise ConfigError(f"prompt_name={name!r} is not one of the model's prompts ({known})")
        return self.prompts[name] or None

    @property
    def layers(self) -> tuple[int, ...]:
        return self.layer if isinstance(self.layer, tuple) else (self.layer,)

    # ------------------------------------------------------------------ groups
    def forward_key(self) -> dict[str, Any]:
        """Fields that change the transformer's input or mask."""
        key: dict[str, Any] = {
            "attention": self.attention,
            "echo": self.echo,
            "echo_template": self.echo_template if self.echo else None,
            "instruction_template": self.instruction_template,
            "add_eos": self.add_eos,
            "max_length": self.max_length,
            "last": self.pooling == "last",  # decides whether an EOS token is appended
            **self._convention_key(),
        }
        # fields added later enter the key only when set, so earlier strategies keep their fingerprints
        optional = {
            "plain_prefix": "",
            "instruction_suffix": "",
            "pool_special_tokens": True,
            "eos_token": None,
            "instruction_mask": "offsets",
        }
        key.update({name: getattr(self, name) for name, default in optional.items() if getattr(self, name) != default})
        return key

    def _convention_key(self) -> dict[str, Any]:
        """The published-model fields that change the input or pool mask, only where they differ from the
        defaults (so strategies without them keep their old fingerprints and cache entries)."""
        key: dict[str, Any] = {}
        if self.prompt_style != "lmembed":
            key["prompt_style"] = self.prompt_style
        if self.include_prompt:
            key["include_prompt"] = True
        if self.lowercase:
            key["lowercase"] = True
        return key

    def pooling_key(self) -> dict[str, Any]:
        """Fields that only read hidden states."""
        key: dict[str, Any] = {"pooling": self.pooling, "layer": list(self.layers), "final_norm": self.final_norm}
        if self.pooling == "latent_attention":
            key["latent"] = self.latent.key()
        if self.head:
            key["head"] = [dict(layer) for layer in self.head]
            key["route"] = self.route
        if self.pooling == "weighted_mean" and self.prompt_style != "lmembed":
            key["positions"] = "sequence"
        return key

    def fingerprint(self) -> str:
        """Stable hash of everything that decides the raw (pre-normalisation) vector."""
        blob = json.dumps({"forward": self.forward_key(), "pool": self.pooling_key()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["layer"] = list(self.layers) if isinstance(self.layer, tuple) else self.layer
        data["head"] = [dict(layer) for layer in self.head]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmbeddingConfig:
        unknown = unknown_options(cls, data)
        if unknown:
            known = sorted(f.name for f in fields(cls))
            raise ConfigError(f"unknown strategy option(s): {', '.join(unknown)}; known: {', '.join(known)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EmbeddingConfig:
        return cls.from_dict(json.loads(text))

    def with_options(self, **changes: Any) -> EmbeddingConfig:
        """A copy with some options changed (validated)."""
        return replace(self, **changes)

    def label(self) -> str:
        """Short human-readable name, e.g. ``mean@-1`` or ``last@[15,16]+bidir+echo``."""
        layers = self.layers
        layer = str(layers[0]) if len(layers) == 1 else "[" + ",".join(map(str, layers)) + "]"
        parts = [f"{self.pooling}@{layer}"]
        if self.final_norm is not None:
            parts.append("norm" if self.final_norm else "raw")
        if self.attention == "bidirectional":
            parts.append("bidir")
        if self.echo:
            parts.append("echo")
        if self.head:
            parts.append("head")
        if self.dim:
            parts.append(f"d{self.dim}")
        return "+".join(parts)


def for_side(config: EmbeddingConfig, side: str, instruction: str | None = None) -> tuple[EmbeddingConfig, str | None]:
    """How ``side`` (``"query"`` or ``"document"``) texts are read under ``config``: the strategy (an asymmetric
    model's head reads that side's route) and the prefix: for queries ``instruction`` or the strategy's
    ``query_instruction``, for documents the strategy's ``document_instruction`` (a published model's prompts)."""
    if side not in ("query", "document"):
        raise ConfigError(f"side={side!r} must be 'query' or 'document'")
    if any(layer.get("route") for layer in config.head) and config.route != side:
        config = config.with_options(route=side)
    if side == "query":
        return config, instruction or config.query_instruction
    return config, config.document_instruction


def validate_head_layer(layer: Any, where: str) -> None:
    """Refuse a post-pooling head layer description lmembed cannot run (``where`` names it in the message)."""
    if not isinstance(layer, dict) or layer.get("type") not in HEAD_LAYERS:
        kinds = ", ".join(HEAD_LAYERS)
        raise ConfigError(f"{where} must be a dict whose 'type' is one of {kinds}, got {layer!r:.80}")
    required, optional = HEAD_LAYERS[layer["type"]]
    keys = set(layer) - {"type"}
    if missing := required - keys:
        raise ConfigError(f"{where} ({layer['type']}) lacks {', '.join(sorted(missing))}")
    if unknown := keys - required - optional:
        raise ConfigError(f"{where} ({layer['type']}) has unknown key(s) {', '.join(sorted(unknown))}")
    activation = layer.get("activation", "identity")
    if layer["type"] == "dense" and activation not in ACTIVATIONS:
        raise ConfigError(f"{where}: activation={activation!r} is unknown; choose one of {', '.join(ACTIVATIONS)}")


AttentionMode = Literal["causal", "bidirectional"]
