"""The extraction strategy: one config object that says how a text becomes a vector.

Everything that changes an embedding (apart from the weights) lives here, so that a strategy can be
saved next to a model, compared in a grid, and used as part of the embedding-cache key. It
round-trips through JSON (``to_dict`` / ``from_dict``).

The fields fall into three groups, which the encoding engine treats differently:

* forward fields (``attention``, ``echo``, ``max_length`` ...) change the transformer's input or
  mask, so strategies that differ in them need separate forward passes;
* pooling fields (``pooling``, ``layer``, ``final_norm`` ...) only read hidden states, so one
  forward pass serves any number of them;
* output fields (``normalize``, ``dim``) are applied after pooling and after the cache;
* prompt fields (``query_instruction``, ``prompts`` ...) choose the text a call prepends, which every cache entry
  keys on its own.

Each field declares its group where it is defined (``_field("forward", ...)``), and ``forward_key`` /
``pooling_key`` (hence the cache fingerprint) are built from those declarations; a new field without a group fails
a test (tests/test_config_groups.py), so it cannot silently mix different vectors under one key.
"""

from __future__ import annotations

import functools
import hashlib
import json
import string
from collections.abc import Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from typing import Any

from lmembed.errors import ConfigError
from lmembed.io import loads_json

PROMPT_STYLES = ("lmembed", "sentence_transformers")
SIMILARITIES = ("cosine", "dot", "euclidean", "manhattan")
HEAD_LAYERS = {
    # type -> (required keys, optional keys); the weights of dense/layer_norm live in the model folder at ``path``
    "dense": ({"in_features", "out_features", "path"}, {"bias", "activation", "residual", "route"}),
    "layer_norm": ({"dimension", "path"}, {"eps", "route"}),
    "normalize": (set(), {"route"}),
}
ACTIVATIONS = ("identity", "tanh", "relu", "gelu", "sigmoid", "silu")
#: The kinds each value of a head layer may be, and how a refusal says it (a saved folder's lmembed.json is a file
#: from elsewhere: its values are checked before a layer is built of them).
HEAD_VALUE_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "in_features": ((int,), "a whole number"),
    "out_features": ((int,), "a whole number"),
    "dimension": ((int,), "a whole number"),
    "path": ((str,), "a string"),
    "bias": ((bool,), "true or false"),
    "residual": ((bool,), "true or false"),
    "activation": ((str,), "a string"),
    "route": ((str,), "a string"),
    "eps": ((float, int), "a number"),
}
#: The backend registry: the runtimes lmembed runs a model on. Kept here, free of torch, so the CLI checks --backend
#: against it without importing torch; lmembed.encoding.backends re-exports it and builds each one.
BACKENDS = ("torch", "onnx", "cuda-graphs")
#: the backbone's own floating types (the torch backend's; the CLI sets them with --dtype)
FLOAT_PRECISIONS = ("float32", "bfloat16", "float16")
#: quantised precisions (quality-gated)
QUANTISED_PRECISIONS = ("int8",)
PRECISIONS = FLOAT_PRECISIONS + QUANTISED_PRECISIONS
#: the precisions every backend runs: what --precision offers (ONNX Runtime's float32 graph, or its int8 one)
PORTABLE_PRECISIONS = (FLOAT_PRECISIONS[0], *QUANTISED_PRECISIONS)

#: The pooling registry: name -> help. Every other list of pooling names derives from it (``POOLINGS``, the CLI's
#: choices, the tests parametrised over poolings); a stateless pooling's function is registered under the same name
#: in ``lmembed.pooling.poolers.STATELESS_POOLERS`` (a test checks the two agree).
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
POOLINGS = tuple(POOLING_HELP)
#: the poolings with trainable weights of their own (a head module, not a function in STATELESS_POOLERS)
TRAINED_POOLINGS = ("latent_attention",)
ATTENTION_HELP = {
    "causal": "each token sees only the tokens before it (a decoder's native mode).",
    "bidirectional": "the causal mask is removed so every token sees the whole text (LLM2Vec, NV-Embed); "
    "encoders always attend this way.",
}
#: The attention modes a strategy takes: the help registry's names.
ATTENTIONS = tuple(ATTENTION_HELP)

DEFAULT_INSTRUCTION_TEMPLATE = "Instruct: {instruction}\nQuery: "
DEFAULT_ECHO_TEMPLATE = "Rewrite the sentence: {text}\nRewritten sentence: "

LayerSpec = int | tuple[int, ...]


def unknown_options(config_class: type, options: Mapping[str, Any]) -> list[str]:
    """The keys of ``options`` that name no field of the dataclass ``config_class``, sorted."""
    return sorted(set(options) - {f.name for f in fields(config_class)})


#: The groups an :class:`EmbeddingConfig` field belongs to (see the module doc). ``prompt`` fields choose the text a
#: call prepends (an instruction, a named prompt); that text is part of every cache entry's own key, so these fields
#: stay out of the fingerprint, as the ``output`` fields do.
FIELD_GROUPS = ("forward", "pooling", "output", "prompt")
#: a field's key rule: enter the key only where the value differs from the default (a field added after strategies
#: were cached, whose fingerprints must not move)
IF_CHANGED = "if_changed"
#: what a derived key rule returns to leave its field out of the key
OMIT: Any = object()
#: a field's sentence-transformers rule: any value is reproduced there (written to its files, or read by nothing
#: sentence-transformers runs once the other fields' rules hold)
ST_ANY = "any"
#: a field's sentence-transformers rule: whether it is reproduced depends on the model (decoder or encoder) or on
#: sentence-transformers' own tables, so ``Embedder.sentence_transformers_compatible`` checks it
ST_BY_EMBEDDER = "by_embedder"


def _field(group: str, default: Any = MISSING, *, factory: Any = MISSING, key: Any = None, st: Any = ST_ANY) -> Any:
    """A dataclass field of :class:`EmbeddingConfig` that declares its ``group`` (one of :data:`FIELD_GROUPS`);
    for the forward and pooling groups, how it enters the cache key (``key``: ``None`` its value as is,
    :data:`IF_CHANGED`, or a function of the config returning the key's value or :data:`OMIT`); and whether a
    saved sentence-transformers folder reproduces it (``st``: :data:`ST_ANY`, :data:`ST_BY_EMBEDDER`, or a
    function of the config that says whether this value is reproduced)."""
    if group not in FIELD_GROUPS:
        raise ValueError(f"group={group!r} is not one of {FIELD_GROUPS}")
    metadata = {"group": group, "key": key, "st": st}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def field_group(f: Field[Any]) -> str | None:
    """The group a field of :class:`EmbeddingConfig` declares (None: it declares none, which a test refuses)."""
    return f.metadata.get("group")


def sentence_transformers_expressible(config: EmbeddingConfig) -> bool:
    """True when every field whose sentence-transformers rule is a check of the config alone passes it (the
    fields whose rule is :data:`ST_BY_EMBEDDER` are left to ``Embedder.sentence_transformers_compatible``)."""
    rules = [f.metadata.get("st") for f in fields(config)]
    return all(rule(config) for rule in rules if callable(rule))


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
        for name, bound in LATENT_BOUNDS.items():  # sizes, checked before a head of them is built
            value = getattr(self, name)
            if name == "head_dim" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= bound:
                raise ConfigError(f"latent.{name}={value!r} must be a whole number from 1 to {bound}")

    def key(self) -> dict[str, Any]:
        """The fields as a dict, the ones added later only where set (earlier strategies keep their fingerprints)."""
        data = asdict(self)
        for name, default in (("variant", "lmembed"), ("head_dim", None)):
            if data[name] == default:
                del data[name]
        return data


LATENT_VARIANTS = ("lmembed", "nv-embed")
#: The largest value of each size of a latent-attention head (NV-Embed's published head: 512 latents, 8 heads).
LATENT_BOUNDS = {"num_latents": 1 << 16, "num_heads": 1 << 10, "hidden_mult": 64, "head_dim": 1 << 14}


#: Why a strategy with a term channel keeps its width and its normalisation.
TERMS_FIXED = "a term channel is weighed against the dense vector in the cosine"


@dataclass(frozen=True)
class TermsConfig:
    """A fitted term channel (:mod:`lmembed.pooling.terms`): ``dims`` hashed buckets appended to the dense vector,
    weighed ``weight`` against it in the cosine; BM25's ``k1`` and ``b`` over documents of ``avg_length`` pooled
    tokens (the mean of the ``documents`` it was fitted on); ``seed`` fixes each token id's bucket and sign;
    ``sha256`` is the digest of the idf table saved beside the model (checked on load)."""

    dims: int
    weight: float
    avg_length: float
    sha256: str
    documents: int = 0
    k1: float = 1.2
    b: float = 0.75
    seed: int = 0

    def __post_init__(self) -> None:
        checks = (
            (isinstance(self.dims, int) and not isinstance(self.dims, bool) and 1 <= self.dims <= 1 << 20, "dims"),
            (_number(self.weight) and self.weight > 0, "weight"),
            (_number(self.avg_length) and self.avg_length > 0, "avg_length"),
            (_number(self.k1) and self.k1 >= 0, "k1"),
            (_number(self.b) and 0 <= self.b <= 1, "b"),
            (isinstance(self.seed, int) and not isinstance(self.seed, bool), "seed"),
            (isinstance(self.documents, int) and self.documents >= 0, "documents"),
            (isinstance(self.sha256, str) and len(self.sha256) == 64, "sha256"),
        )
        for ok, name in checks:
            if not ok:
                raise ConfigError(f"terms.{name}={getattr(self, name)!r} is not valid")


def _number(value: Any) -> bool:
    finite = isinstance(value, int | float) and value == value and abs(value) != float("inf")
    return finite and not isinstance(value, bool)


INSTRUCTION_MASKS = ("offsets", "token_count", "text_tokens")
#: Bounds on a strategy's sizes (far above any model's): a larger value is a mistake or a hostile file.
MAX_TOKENS = 1 << 20
MAX_DIM = 1 << 20


def _is_kind(value: Any, kind: type | None) -> bool:
    """``value`` is of the plain ``kind`` strictly: no bool for an int, no 8.0 or "8" for an int, no "false" for a
    bool (None: the value is None)."""
    if kind is None:
        return value is None
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


@functools.cache
def _plain_fields() -> dict[str, tuple[type | None, ...]]:
    """EmbeddingConfig's fields of plain types (bool, int, str, each or None), by name: those checked by type."""
    plain = {"bool": bool, "int": int, "str": str, "None": None}
    out: dict[str, tuple[type | None, ...]] = {}
    for f in fields(EmbeddingConfig):
        parts = [part.strip() for part in str(f.type).split("|")]
        if all(part in plain for part in parts):
            out[f.name] = tuple(plain[part] for part in parts)
    return out


@dataclass(frozen=True)
class EmbeddingConfig:
    """How to turn a text into a vector with a given backbone.

    ``layer`` indexes the backbone's hidden states as transformers returns them: 0 is the
    embedding layer, ``-1`` the final output (after the final norm in decoders). A tuple of layers
    is averaged ("fused"). ``final_norm=True`` applies the decoder's final norm to whichever layer
    is read, ``False`` reads raw residual-stream states even for the last layer, ``None`` keeps
    transformers' convention.
    """

    pooling: str = _field("pooling", "mean", st=ST_BY_EMBEDDER)
    layer: LayerSpec = _field(  # noqa: RUF009 (a field specifier)
        "pooling", -1, key=lambda cfg: list(cfg.layers), st=lambda cfg: cfg.layers == (-1,)
    )
    final_norm: bool | None = _field("pooling", None, st=lambda cfg: cfg.final_norm is None)
    attention: str = _field("forward", "causal", st=ST_BY_EMBEDDER)
    echo: bool = _field("forward", False, st=lambda cfg: not cfg.echo)
    echo_template: str = _field(
        "forward", DEFAULT_ECHO_TEMPLATE, key=lambda cfg: cfg.echo_template if cfg.echo else None
    )
    instruction_template: str = _field("forward", DEFAULT_INSTRUCTION_TEMPLATE)
    query_instruction: str | None = _field("prompt", None)
    # put before a text embedded without an instruction, kept out of pooling (GritLM)
    plain_prefix: str = _field("forward", "", key=IF_CHANGED, st=lambda cfg: not cfg.plain_prefix)
    # put after a text embedded with an instruction, pooled with the text (bge-en-icl's "\n<response>", whose end
    # last-token pooling reads)
    instruction_suffix: str = _field("forward", "", key=IF_CHANGED, st=lambda cfg: not cfg.instruction_suffix)
    # False: special tokens (BOS, ...) never pooled, as LLM2Vec's embed mask
    pool_special_tokens: bool = _field("forward", True, key=IF_CHANGED, st=lambda cfg: cfg.pool_special_tokens)
    # which tokens an instruction keeps out of pooling: "offsets" those before the text (by character offsets),
    # "token_count" the first len(tokenizer.tokenize(prefix)) tokens of the sequence, BOS included (NV-Embed)
    # "text_tokens": only the last len(text tokenised alone) tokens are pooled (LLM2Vec's embed mask)
    instruction_mask: str = _field("forward", "offsets", key=IF_CHANGED)
    add_eos: bool | None = _field("forward", None, st=ST_BY_EMBEDDER)
    # the token appended for last-token pooling; None: the tokenizer's EOS
    eos_token: str | None = _field("forward", None, key=IF_CHANGED, st=ST_BY_EMBEDDER)
    max_length: int | None = _field("forward", None)  # None: the model's own limit (at most 512), resolved on load
    normalize: bool = _field("output", True)
    dim: int | None = _field("output", None, st=lambda cfg: cfg.dim is None)
    latent: LatentAttentionConfig = _field(  # noqa: RUF009 (a field specifier, like dataclasses.field)
        "pooling",
        factory=LatentAttentionConfig,
        key=lambda cfg: cfg.latent.key() if cfg.pooling == "latent_attention" else OMIT,
    )
    # --- a published model's own conventions (read from its folder; see lmembed.models.sentence_transformers_folder)
    prompt_style: str = _field("forward", "lmembed", key=IF_CHANGED)
    include_prompt: bool = _field("forward", False, key=IF_CHANGED)
    prompts: dict[str, str] = _field("prompt", factory=dict)  # noqa: RUF009 (a field specifier)
    default_prompt_name: str | None = _field("prompt", None)
    document_instruction: str | None = _field("prompt", None)
    lowercase: bool = _field("forward", False, key=IF_CHANGED)
    similarity: str = _field("output", "cosine")
    head: tuple[dict[str, Any], ...] = _field(
        "pooling",
        (),
        key=lambda cfg: [dict(layer) for layer in cfg.head] if cfg.head else OMIT,
        st=lambda cfg: not any(layer.get("route") for layer in cfg.head),  # sentence-transformers has no routes
    )
    route: str | None = _field("pooling", None, key=lambda cfg: cfg.route if cfg.head or cfg.terms else OMIT)
    # a term channel fitted on a corpus, appended to the vector (lmembed.pooling.terms); its table is in the folder
    terms: TermsConfig | None = _field(  # noqa: RUF009 (a field specifier)
        "pooling", None, key=lambda cfg: asdict(cfg.terms) if cfg.terms else OMIT, st=lambda cfg: cfg.terms is None
    )

    def __hash__(self) -> int:  # prompts and head are dicts: hash the JSON form (equal configs, equal hashes)
        return hash(self.to_json())

    def __post_init__(self) -> None:
        if isinstance(self.layer, list):
            object.__setattr__(self, "layer", tuple(self.layer))
        if isinstance(self.latent, dict):
            object.__setattr__(self, "latent", LatentAttentionConfig(**self.latent))
        if isinstance(self.head, list):  # a copy of each layer object; anything else is left for validate to name
            copied = tuple(dict(layer) if isinstance(layer, dict) else layer for layer in self.head)
            object.__setattr__(self, "head", copied)
        if isinstance(self.terms, dict):
            unknown = unknown_options(TermsConfig, self.terms)
            if unknown:
                raise ConfigError(f"unknown terms option(s): {', '.join(unknown)}")
            try:
                object.__setattr__(self, "terms", TermsConfig(**self.terms))
            except TypeError as exc:
                raise ConfigError(f"terms: {exc}") from exc
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        for name, kinds in _plain_fields().items():  # before any value is used: "false" is not False
            value = getattr(self, name)
            if not any(_is_kind(value, kind) for kind in kinds):
                wanted = " or ".join("None" if k is None else k.__name__ for k in kinds)
                raise ConfigError(f"{name}={value!r:.80} must be {wanted}")
        if self.pooling not in POOLING_HELP:  # the registry itself, read live (a pooling registered at run time counts)
            raise ConfigError(f"pooling={self.pooling!r} is unknown; choose one of {', '.join(POOLING_HELP)}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"attention={self.attention!r} is unknown; choose one of {', '.join(ATTENTIONS)}")
        layers = self.layers
        if not layers or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
            raise ConfigError(f"layer={self.layer!r} must be an int or a non-empty list of ints")
        if self.max_length is not None and not 8 <= self.max_length <= MAX_TOKENS:
            raise ConfigError(f"max_length={self.max_length} must be from 8 to {MAX_TOKENS} tokens")
        if self.dim is not None and not 1 <= self.dim <= MAX_DIM:
            raise ConfigError(f"dim={self.dim} must be a positive int up to {MAX_DIM}, or None")
        if "{text}" not in self.echo_template:
            raise ConfigError("echo_template must contain '{text}' (the first copy of the input)")
        _check_template(self.echo_template, "echo_template", "text")
        _check_template(self.instruction_template, "instruction_template", "instruction")
        if not isinstance(self.latent, LatentAttentionConfig):
            raise ConfigError(f"latent={self.latent!r:.80} must be an object of latent-attention options")
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
        if not isinstance(self.head, tuple):  # a string or an object would be walked as if it were the layers
            raise ConfigError(f"head must be a list of layer objects, not {_what(self.head)}")
        for i, layer in enumerate(self.head):
            validate_head_layer(layer, f"head[{i}]")
        if self.head and self.pooling == "latent_attention":
            raise ConfigError("a post-pooling head cannot follow pooling='latent_attention'")
        if self.terms is not None and not isinstance(self.terms, TermsConfig):
            raise ConfigError(f"terms={self.terms!r:.80} must be a term channel's settings (a dict) or None")
        if self.terms is not None and (self.dim is not None or not self.normalize or self.similarity != "cosine"):
            wanted = {"dim": None, "normalize": True, "similarity": "cosine"}
            wrong = ", ".join(f"{k}={getattr(self, k)!r}" for k, v in wanted.items() if getattr(self, k) != v)
            raise ConfigError(
                f"{wrong}: {TERMS_FIXED}, so it needs normalize=True, similarity='cosine' and no dim truncation"
            )

    def fixed_width(self) -> str | None:
        """Why this strategy's vectors cannot be shortened (Matryoshka ``dim``) or left unnormalised, or None when
        they can."""
        return TERMS_FIXED if self.terms is not None else None

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
        """The forward fields (those declared ``_field("forward", ...)``): they change the transformer's input or
        mask. ``last`` is derived from the pooling, because last-token pooling decides whether an EOS is appended."""
        return {**self._group_key("forward"), "last": self.pooling == "last"}

    def pooling_key(self) -> dict[str, Any]:
        """The pooling fields (those declared ``_field("pooling", ...)``): they only read hidden states.
        ``positions`` is derived: weighted-mean pooling counts positions over the whole sequence under
        sentence-transformers' prompt style."""
        key = self._group_key("pooling")
        if self.pooling == "weighted_mean" and self.prompt_style != "lmembed":
            key["positions"] = "sequence"
        return key

    def _group_key(self, group: str) -> dict[str, Any]:
        """Each field of ``group`` under the key rule its declaration gives (see :func:`_field`)."""
        key: dict[str, Any] = {}
        for f in fields(self):
            if field_group(f) != group:
                continue
            rule = f.metadata.get("key")
            value = getattr(self, f.name)
            if rule is None:
                key[f.name] = value
            elif rule == IF_CHANGED:
                if value != f.default:
                    key[f.name] = value
            elif (derived := rule(self)) is not OMIT:
                key[f.name] = derived
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
        if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
            raise ConfigError(f"a strategy is an object of options by name, not {type(data).__name__} ({data!r:.60})")
        unknown = unknown_options(cls, data)
        if unknown:
            known = sorted(f.name for f in fields(cls))
            raise ConfigError(f"unknown strategy option(s): {', '.join(unknown)}; known: {', '.join(known)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> EmbeddingConfig:
        if not isinstance(text, str | bytes):
            raise ConfigError(f"a strategy in JSON is text, not {type(text).__name__}")
        try:
            data = loads_json(text)
        except ValueError as exc:  # not JSON, or a key given twice
            raise ConfigError(f"the strategy is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"a strategy in JSON is an object of options, not {type(data).__name__}")
        return cls.from_dict(data)

    def with_options(self, **changes: Any) -> EmbeddingConfig:
        """A copy with some options changed (validated)."""
        unknown = unknown_options(type(self), changes)
        if unknown:
            raise ConfigError(f"unknown strategy option(s): {', '.join(unknown)}")
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
        if self.terms:
            parts.append(f"terms{self.terms.dims}")
        return "+".join(parts)


#: The two sides of an asymmetric search model: how a text is read depends on which it is (:func:`for_side`).
SIDES = ("query", "document")


def for_side(config: EmbeddingConfig, side: str, instruction: str | None = None) -> tuple[EmbeddingConfig, str | None]:
    """How ``side`` (``"query"`` or ``"document"``) texts are read under ``config``: the strategy (an asymmetric
    model's head reads that side's route) and the prefix: for queries ``instruction`` or the strategy's
    ``query_instruction``, for documents the strategy's ``document_instruction`` (a published model's prompts)."""
    if side not in SIDES:
        raise ConfigError(f"side={side!r} must be 'query' or 'document'")
    if (config.terms or any(layer.get("route") for layer in config.head)) and config.route != side:
        config = config.with_options(route=side)
    if side == "query":
        return config, instruction or config.query_instruction
    return config, config.document_instruction


def _check_template(template: str, name: str, slot: str) -> None:
    """A prompt template fills exactly one named slot, ``{slot}``: any other field (``{foo}``, ``{0}``) or a stray
    brace would fail at the first text, far from where the template was given."""
    try:
        fields_used = {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError as exc:
        raise ConfigError(f"{name}={template!r:.80}: {exc} (write a literal brace as {{{{ or }}}})") from None
    others = sorted(fields_used - {slot})
    if others:
        named = ", ".join(repr(o) for o in others)
        raise ConfigError(f"{name}={template!r:.80} names {named}; only {{{slot}}} is filled")


def validate_head_layer(layer: Any, where: str) -> None:
    """Refuse a post-pooling head layer description lmembed cannot run (``where`` names it in the message)."""
    kinds = ", ".join(HEAD_LAYERS)
    if not isinstance(layer, dict):
        raise ConfigError(f"{where} must be an object whose 'type' is one of {kinds}, not {_what(layer)}")
    if not isinstance(layer.get("type"), str) or layer["type"] not in HEAD_LAYERS:
        raise ConfigError(f"{where}.type must be one of {kinds}, not {_what(layer.get('type'))}")
    required, optional = HEAD_LAYERS[layer["type"]]
    keys = set(layer) - {"type"}
    if missing := required - keys:
        raise ConfigError(f"{where} ({layer['type']}) lacks {', '.join(sorted(missing))}")
    if unknown := keys - required - optional:
        raise ConfigError(f"{where} ({layer['type']}) has unknown key(s) {', '.join(sorted(unknown))}")
    for key, (kinds_of, wanted) in HEAD_VALUE_KINDS.items():  # each value's type, before a layer is built of it
        if key in layer and not any(_is_kind(layer[key], kind) for kind in kinds_of):
            raise ConfigError(f"{where}.{key} must be {wanted}, not {_what(layer[key])}")
    for key in ("in_features", "out_features", "dimension"):  # upper bounds: checked against the weights' shapes
        if key in layer and layer[key] < 1:
            raise ConfigError(f"{where}.{key} must be a positive size, not {layer[key]}")
    if "eps" in layer and not 0 < layer["eps"] <= 1:  # an int too large for a float compares without overflow
        raise ConfigError(f"{where}.eps must be a number above 0 and at most 1, not {layer['eps']!r:.80}")
    activation = layer.get("activation", "identity")
    if layer["type"] == "dense" and activation not in ACTIVATIONS:
        raise ConfigError(f"{where}.activation must be one of {', '.join(ACTIVATIONS)}, not {_what(activation)}")


def _what(value: Any) -> str:
    """What a value from elsewhere is, for a refusal: its JSON kind and (cut short) its text."""
    kind = {dict: "an object", list: "a list", tuple: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    name = kind.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)
    return f"{name} ({value!r:.80})"
