"""Which models lmembed can run, and whether each one is a decoder, decided from the model itself.

"Decoder" here means what the encoding engine needs to know: the model attends causally in its native
mode (each token sees only the tokens before it). That decides left padding, the EOS token appended for
``last`` pooling, the final-norm handling and whether ``attention="bidirectional"`` has to change the mask.
A wrong answer gives quietly wrong vectors, so it is not taken from a list of known model types:

* a probe runs the model once, natively, on two 5-token sequences that differ only in their last token;
  if the first token's final state does not move, the model attends causally and is a decoder;
* the config's own statements (``is_decoder``, ``architectures`` such as ``*ForCausalLM``, and whether
  transformers maps the model type to a causal-LM or a masked-LM head) are only compared with the probe
  and logged when they disagree: a Gemma 3 config with bidirectional attention switched on, for
  instance, is a natively bidirectional model whatever its family usually is.

The probe's answer is remembered on the model object, so wrapping the same model again (after the engine
has switched its attention modules to bidirectional) gives the same answer.

Models that cannot be run as a text embedder are refused here with a :class:`ModelLoadError` rather than
failing later or, worse, producing vectors: encoder-decoder models (they need decoder inputs), composite
multimodal models (their text model has its own model type) and models whose ``forward`` takes no
``attention_mask`` (padding would leak into the vectors).

How a model is given its inputs follows the model's own ``forward``, family by family (:data:`ENCODER_FAMILIES`):
every decoder numbers positions 0, 1, 2 ... over its real tokens (left padding shifts nothing), but encoders
differ. BERT-style models number them from 0, fairseq-style ones (RoBERTa, XLM-R, CamemBERT, MPNet ...) from
``padding_idx + 1`` (``padding_idx`` itself marks padding), and a few number them themselves and take none.
Positions 0, 1, 2 ... given to a RoBERTa put every token on its neighbour's position row and moved its vectors
(cosine 0.81 to sentence-transformers' on a tiny random model, 0.19 for MPNet). The registry lists each encoder
family whose vectors ``tests/models/test_family_matrix.py`` checks against sentence-transformers with padded
batches, and the backends it was checked on; :func:`check_verified` refuses an encoder family (or a backend of
one) outside it. Token types are never passed: every listed family's tokenizer gives a single text type 0, which
is the models' own default.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmembed.errors import ModelLoadError

log = logging.getLogger(__name__)

# The first token's state may move by this much (relative to its size) and still count as unmoved. Causal
# models give exactly 0 (the first token's computation is the same in both rows); tiny random encoders
# give 1e-4 and more, real ones far more.
CAUSAL_TOLERANCE = 1e-5
PROBE_LENGTH = 5
_REMEMBERED = "_lmembed_is_decoder"


#: Positions 0, 1, 2 ... over a row's real tokens (BERT-style encoders; every decoder).
COUNTED = "counted"
#: Positions ``padding_idx + 1``, ``+ 2`` ... over the real tokens, ``padding_idx`` on padding (fairseq's numbering:
#: RoBERTa, XLM-R, CamemBERT, MPNet; ``padding_idx`` is the config's ``pad_token_id``).
AFTER_PADDING = "after_padding"
#: ``forward`` takes no position ids: the model numbers its positions itself (right padding only).
OWN = "own"
#: What a verified family may run on: ``torch`` (float and torch's dynamic int8), ``onnx`` (float32 graph), ``int8``
#: (the quantised ONNX graph), ``cuda-graphs`` (the torch model on a GPU, replayed per bucketed batch shape).
ALL_BACKENDS = ("torch", "onnx", "int8", "cuda-graphs")


@dataclass(frozen=True)
class EncoderFamily:
    """How one encoder family's ``forward`` numbers positions, and the backends its vectors were checked on."""

    positions: str
    backends: tuple[str, ...] = ALL_BACKENDS
    #: Why a backend is missing from :attr:`backends` (said in the refusal).
    note: str = ""
    #: Whether a text's vector depends on the padding beside it (the model reads padded positions whatever the
    #: attention mask says): such a family is batched only with texts of its own length, so it is never padded.
    reads_padding: bool = False


#: Encoder families checked against sentence-transformers (tests/models/test_family_matrix.py): model_type -> its
#: conventions. The test matrix takes its parameters from here, so a family added here is tested.
ENCODER_FAMILIES: dict[str, EncoderFamily] = {
    "bert": EncoderFamily(COUNTED),
    "distilbert": EncoderFamily(OWN),
    "electra": EncoderFamily(COUNTED),
    "albert": EncoderFamily(COUNTED),
    "ernie": EncoderFamily(COUNTED),
    "megatron-bert": EncoderFamily(COUNTED),
    "rembert": EncoderFamily(COUNTED),
    "big_bird": EncoderFamily(COUNTED),  # full attention at these lengths (block-sparse needs longer texts)
    "bert-generation": EncoderFamily(COUNTED),
    "roformer": EncoderFamily(OWN),  # rotary positions from the row's own index
    "deberta": EncoderFamily(COUNTED),
    "convbert": EncoderFamily(
        COUNTED,
        ("torch", "onnx", "int8"),
        "its span convolutions read the padding beside a text, so the wider batches of cuda-graphs change its vectors",
        reads_padding=True,
    ),
    "nomic_bert": EncoderFamily(COUNTED),
    "gte": EncoderFamily(COUNTED),
    "jina_embeddings_v3": EncoderFamily(COUNTED),
    "ibert": EncoderFamily(AFTER_PADDING),
    "deberta-v2": EncoderFamily(
        COUNTED,
        ("torch", "onnx", "cuda-graphs"),
        "int8's calibration reads the relative-position projections as if they were token rows",
    ),
    "modernbert": EncoderFamily(COUNTED),
    "roberta": EncoderFamily(AFTER_PADDING),
    "xlm-roberta": EncoderFamily(AFTER_PADDING),
    "camembert": EncoderFamily(AFTER_PADDING),
    "xlm-roberta-xl": EncoderFamily(AFTER_PADDING),
    "data2vec-text": EncoderFamily(AFTER_PADDING),
    "roberta-prelayernorm": EncoderFamily(AFTER_PADDING),
    "mpnet": EncoderFamily(AFTER_PADDING),
    "t5": EncoderFamily(OWN),  # T5EncoderModel (sentence-t5): relative position buckets only
    # a decoder family switched to bidirectional attention in its config (EmbeddingGemma): an encoder here
    "gemma3_text": EncoderFamily(
        COUNTED, ("torch",), "its bidirectional sliding-window mask does not export to ONNX (torch.onnx fails in vmap)"
    ),
}


@dataclass(frozen=True)
class ModelKind:
    """The verdict on one model: decoder or not, and what the config said."""

    is_decoder: bool
    first_token_change: float  # relative change of the first token's state in the probe
    config_says_decoder: bool | None  # None: the config makes no statement either way


def forward_parameters(model: nn.Module) -> set[str]:
    """Names of the model's ``forward`` parameters (``**kwargs`` excluded)."""
    params = inspect.signature(model.forward).parameters.values()
    return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def config_says_decoder(config: Any) -> bool | None:
    """What the config states: True (a causal decoder), False (an encoder) or None (nothing)."""
    # lazy: transformers is heavy and only needed once a model is loaded
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if getattr(config, "is_decoder", False):
        return True
    architectures = getattr(config, "architectures", None) or []
    if any(name.endswith(("ForCausalLM", "LMHeadModel")) for name in architectures):
        return True
    if any(name.endswith("ForMaskedLM") for name in architectures):
        return False
    model_type = getattr(config, "model_type", None)
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:  # encoders that can also be run as decoders
        return False
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return True
    return None


def check_runnable(model: nn.Module) -> None:
    """Raise :class:`ModelLoadError` for a model the encoding engine cannot run as a text embedder."""
    config = model.config
    model_type = getattr(config, "model_type", "?")
    params = forward_parameters(model)
    if getattr(config, "is_encoder_decoder", False) or "decoder_input_ids" in params:
        raise ModelLoadError(
            f"model_type={model_type!r} ({type(model).__name__}) is an encoder-decoder model, which lmembed "
            "does not run; load its encoder alone (e.g. T5EncoderModel) and wrap that with Embedder.from_model"
        )
    missing = [name for name in ("hidden_size", "num_hidden_layers") if not hasattr(config, name)]
    if missing:
        sub = ", ".join(sorted(getattr(config, "sub_configs", {}) or {})) or "none"
        raise ModelLoadError(
            f"model_type={model_type!r} ({type(model).__name__}) has no {' / '.join(missing)} in its config: it "
            f"is a composite model (sub-configs: {sub}); load its text model instead"
        )
    if "attention_mask" not in params:
        raise ModelLoadError(
            f"model_type={model_type!r} ({type(model).__name__}): forward() takes no attention_mask, so padded "
            "batches would change the vectors; lmembed cannot run it"
        )


def probe_ids(model: nn.Module, device: torch.device) -> torch.Tensor:
    """Two sequences of :data:`PROBE_LENGTH` tokens that differ only in the last token, chosen so that
    the two last tokens really have different embeddings (quantised checkpoints can share one row
    between several token ids)."""
    table = model.get_input_embeddings().weight
    vocab = table.shape[0]
    spread = [int(vocab * f) for f in (0.31, 0.37, 0.43, 0.53, 0.61)]
    last = spread[-1]
    other = next(
        (i for i in range(int(vocab * 0.71), vocab) if not torch.equal(table[i], table[last])),
        None,
    )
    if other is None:
        raise ModelLoadError("cannot build an attention probe: every token embedding is identical")
    return torch.tensor([spread, [*spread[:-1], other]], device=device)


def _probe(model: nn.Module, attention_mask: torch.Tensor | None, hidden_states: bool) -> Any:
    param = next(model.parameters())
    ids = probe_ids(model, param.device)
    kwargs: dict[str, Any] = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids) if attention_mask is None else attention_mask,
    }
    if hidden_states:
        kwargs["output_hidden_states"] = True
    if "use_cache" in forward_parameters(model):
        kwargs["use_cache"] = False
    with torch.inference_mode():
        return model(**kwargs)


def _first_token_change(out: Any) -> float:
    states = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    first = states[:, 0].float()
    delta = float((first[0] - first[1]).abs().max())
    scale = max(1.0, float(first.abs().max()))
    return delta / scale


def first_token_change(model: nn.Module, attention_mask: torch.Tensor | None = None) -> float:
    """Relative change of the first token's final state when only the last token changes.

    ``attention_mask`` defaults to a plain 2-D mask of ones, i.e. the model's native attention. Zero (up
    to float noise) means the first token ignores later tokens: causal attention.
    """
    return _first_token_change(_probe(model, attention_mask, hidden_states=False))


def _check_hidden_states(model: nn.Module, out: Any) -> None:
    """The engine pools ``hidden_states[layer]``: one (batch, tokens, hidden) tensor per layer, plus the
    embeddings. A model that returns anything else would be pooled from the wrong place."""
    config = model.config
    expected = (2, PROBE_LENGTH, int(config.hidden_size))
    states = getattr(out, "hidden_states", None)
    shapes = [tuple(s.shape) for s in states] if states is not None else None
    if shapes is None or len(shapes) != int(config.num_hidden_layers) + 1 or any(s != expected for s in shapes):
        found = "none" if shapes is None else f"{len(shapes)} of shapes {sorted(set(shapes))}"
        raise ModelLoadError(
            f"model_type={getattr(config, 'model_type', '?')!r} ({type(model).__name__}) does not return "
            f"num_hidden_layers + 1 = {int(config.num_hidden_layers) + 1} hidden states of shape (batch, tokens, "
            f"{config.hidden_size}) (found {found}); lmembed cannot pool from it"
        )


def detect_kind(model: nn.Module) -> ModelKind:
    """Refuse models lmembed cannot run, then decide decoder-ness by the probe (see the module doc)."""
    check_runnable(model)
    config = model.config
    stated = config_says_decoder(config)
    remembered = getattr(model, _REMEMBERED, None)
    if isinstance(remembered, ModelKind):
        return remembered
    was_training = model.training
    model.eval()
    try:
        out = _probe(model, None, hidden_states=True)
    except ModelLoadError:
        raise
    except Exception as exc:  # any failure here means the engine could not run the model either
        raise ModelLoadError(
            f"model_type={getattr(config, 'model_type', '?')!r} ({type(model).__name__}): a {PROBE_LENGTH}-token "
            f"test forward pass with input_ids and attention_mask failed ({type(exc).__name__}: {exc}); "
            "lmembed cannot run this model"
        ) from exc
    finally:
        model.train(was_training)
    _check_hidden_states(model, out)
    change = _first_token_change(out)
    kind = ModelKind(is_decoder=change <= CAUSAL_TOLERANCE, first_token_change=change, config_says_decoder=stated)
    if stated is not None and stated != kind.is_decoder:
        log.info(
            "model_type=%r: the config suggests %s, but the model attends %s (first-token change %.2e); "
            "treating it as %s",
            getattr(config, "model_type", "?"),
            "a decoder" if stated else "an encoder",
            "causally" if kind.is_decoder else "bidirectionally",
            change,
            "a decoder" if kind.is_decoder else "an encoder",
        )
    setattr(model, _REMEMBERED, kind)
    return kind


def _model_type(model: nn.Module) -> str:
    return str(getattr(model.config, "model_type", "?"))


def encoder_family(model: nn.Module) -> EncoderFamily:
    """The registry entry of an encoder ``model``; :class:`ModelLoadError` for a family outside it."""
    model_type = _model_type(model)
    family = ENCODER_FAMILIES.get(model_type)
    if family is None:
        raise ModelLoadError(
            f"model_type={model_type!r} ({type(model).__name__}) is an encoder family whose position and token-type "
            "conventions lmembed has not checked against sentence-transformers, so its vectors could be silently "
            f"wrong; the checked encoder families are: {', '.join(sorted(ENCODER_FAMILIES))}"
        )
    return family


def check_verified(model: nn.Module, is_decoder: bool, backend: str) -> None:
    """Refuse an encoder family outside :data:`ENCODER_FAMILIES`, or a ``backend`` (``torch``, ``onnx`` or
    ``int8``) its vectors were not checked on, with a :class:`ModelLoadError` naming the model type, the backend
    and what is supported. Decoders all follow one convention (positions counted over the real tokens)."""
    if is_decoder:
        return
    family = encoder_family(model)
    if backend not in family.backends:
        reason = f" ({family.note})" if family.note else ""
        raise ModelLoadError(
            f"model_type={_model_type(model)!r} is not checked on the {backend} backend{reason}; it runs on: "
            f"{', '.join(family.backends)}"
        )


def reads_padding(model: nn.Module, is_decoder: bool) -> bool:
    """Whether ``model``'s vectors depend on the padding beside a text (:attr:`EncoderFamily.reads_padding`)."""
    return not is_decoder and encoder_family(model).reads_padding


def position_convention(model: nn.Module, is_decoder: bool) -> str:
    """How ``model`` is given its positions: :data:`COUNTED`, :data:`AFTER_PADDING` or :data:`OWN` (none given: also
    for a model of a listed family whose ``forward`` takes none, such as a remote-code variant)."""
    if "position_ids" not in forward_parameters(model):
        return OWN
    return COUNTED if is_decoder else encoder_family(model).positions


def position_ids(convention: str, attention_mask: torch.Tensor, padding_idx: int | None = None) -> torch.Tensor | None:
    """The ``position_ids`` of a padded batch under ``convention`` (None for :data:`OWN`): each real token gets the
    position it has in its text alone, whichever side the padding is on."""
    if convention == OWN:
        return None
    counted = attention_mask.long().cumsum(dim=1)
    if convention == COUNTED:
        return (counted - 1).clamp(min=0)
    if convention == AFTER_PADDING:
        if padding_idx is None:
            raise ModelLoadError("positions numbered after padding_idx need the config's pad_token_id, which is unset")
        return counted * attention_mask.long() + padding_idx
    raise ValueError(f"unknown position convention {convention!r}")


def model_position_ids(model: nn.Module, is_decoder: bool, attention_mask: torch.Tensor) -> torch.Tensor | None:
    """``position_ids`` for ``model``'s forward on a padded batch (None where the model numbers them itself)."""
    convention = position_convention(model, is_decoder)
    return position_ids(convention, attention_mask, getattr(model.config, "pad_token_id", None))
