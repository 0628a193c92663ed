"""What an exported graph computes: the hidden states a set of strategies pools, nothing more.

A :class:`Readout` is what one strategy reads from the transformer (which layers, averaged, with or without
the decoder's final norm). :class:`StateGraph` wraps a backbone as a module whose inputs are token ids and a
2-D attention mask and whose outputs are exactly the readouts' states: position ids and the 4-D mask
(causal or bidirectional) are built inside it, and pooling stays outside, in lmembed's own code, so every
pooling (including a trained latent-attention head) works on any backend.

:func:`export_onnx` traces a :class:`StateGraph` to an ONNX file. Encoders are traced with transformers'
eager attention, whose pattern ONNX Runtime's transformer optimiser recognises and fuses (one ``Attention``
op per layer); :func:`fuse_onnx` runs that optimiser (fused attention, LayerNorm with the residual add,
GELU with its bias).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmembed.config import EmbeddingConfig
from lmembed.models.attention import bidirectional_window, four_d_mask, set_causal_flags
from lmembed.models.depth import exit_depth, forward_states
from lmembed.models.families import model_position_ids
from lmembed.models.loading import Backbone
from lmembed.pooling.layers import find_final_norm, normalize_layer, select_states

log = logging.getLogger(__name__)

#: ONNX opset of exported graphs (Trilu, LayerNormalization and the fused contrib ops are all available).
OPSET = 17
#: Exported graphs larger than this keep their weights in a side file (protobuf's limit is 2 GB).
EXTERNAL_DATA_BYTES = 1_800_000_000


@dataclass(frozen=True)
class Readout:
    """The states one strategy pools: the mean of ``layers`` (0 = embeddings), read through the final norm
    per ``final_norm`` (see :func:`lmembed.pooling.layers.select_states`)."""

    layers: tuple[int, ...]
    final_norm: bool | None

    def label(self) -> str:
        norm = {None: "", True: "+norm", False: "+raw"}[self.final_norm]
        return "L" + "_".join(str(x) for x in self.layers) + norm


def readout_of(config: EmbeddingConfig, num_layers: int, is_decoder: bool) -> Readout:
    """The readout of ``config``; ``final_norm`` only matters for decoders (encoders have no final norm)."""
    layers = tuple(normalize_layer(x, num_layers) for x in config.layers)
    return Readout(layers, config.final_norm if is_decoder else None)


def readouts_of(configs: Sequence[EmbeddingConfig], num_layers: int, is_decoder: bool) -> list[Readout]:
    """The distinct readouts of ``configs``, in first-seen order."""
    seen: dict[Readout, None] = {}
    for cfg in configs:
        seen.setdefault(readout_of(cfg, num_layers, is_decoder), None)
    return list(seen)


#: How a decoder family decides which layers attend through a sliding window (as its own transformers code decides):
#: no window at all; every layer, whenever ``config.sliding_window`` is set (Mistral, Phi-3, StarCoder2: one
#: ``create_sliding_window_causal_mask`` for the whole stack); or the layers ``config.layer_types`` names
#: ``sliding_attention`` (Qwen2 derives them from ``use_sliding_window`` and ``max_window_layers``; Qwen3, Gemma 2
#: and 3).
NO_WINDOW = "none"
WINDOW_EVERY_LAYER = "every_layer"
WINDOW_BY_LAYER_TYPE = "layer_types"

#: Decoder families whose exported graph is verified against the torch path on padded batches of texts longer than
#: an 8-token sliding window (tests/encoding/test_onnx_families.py takes its parameters from here, so a family
#: added here is tested), with the way each decides its sliding-window layers. Any other decoder's export is
#: refused (:func:`export_refusal`) rather than traced into a graph nobody has compared with torch.
EXPORT_DECODERS: dict[str, str] = {
    "llama": NO_WINDOW,
    "gemma": NO_WINDOW,
    "gpt2": NO_WINDOW,
    "gpt_neox": NO_WINDOW,
    "gptj": NO_WINDOW,
    "opt": NO_WINDOW,
    "phi": NO_WINDOW,
    "olmo": NO_WINDOW,
    "olmo2": NO_WINDOW,
    "stablelm": NO_WINDOW,
    "falcon": NO_WINDOW,
    "mistral": WINDOW_EVERY_LAYER,
    "phi3": WINDOW_EVERY_LAYER,
    "starcoder2": WINDOW_EVERY_LAYER,
    "qwen2": WINDOW_BY_LAYER_TYPE,
    "qwen3": WINDOW_BY_LAYER_TYPE,
    "gemma2": WINDOW_BY_LAYER_TYPE,
    "gemma3_text": WINDOW_BY_LAYER_TYPE,
}
#: Config switches of a verified family that its export is not verified with (refused when set): Falcon's ALiBi
#: positions (the graph's 4-D mask would replace the ALiBi bias the model folds into its own mask).
EXPORT_UNVERIFIED_SWITCHES: dict[str, tuple[str, ...]] = {"falcon": ("alibi",)}
#: Families of :data:`EXPORT_DECODERS` whose int8 graph (the float32 graph quantised,
#: :mod:`lmembed.encoding.backends.int8`) is not verified, and why; the others are checked against torch in the
#: same test file.
INT8_UNVERIFIED: dict[str, str] = {"gpt2": "int8 calibration cannot map its Conv1D graph's products"}


def export_refusal(config: Any, precision: str = "float32") -> str | None:
    """Why a decoder with ``config`` cannot be exported at ``precision`` (None when its family, settings and
    precision are verified)."""
    model_type = getattr(config, "model_type", None)
    verified = ", ".join(sorted(EXPORT_DECODERS))
    if model_type not in EXPORT_DECODERS:
        return f"model_type={model_type!r} has no verified ONNX export (verified decoder families: {verified})"
    if precision == "int8" and model_type in INT8_UNVERIFIED:
        int8 = ", ".join(sorted(set(EXPORT_DECODERS) - set(INT8_UNVERIFIED)))
        return (
            f"model_type={model_type!r} has no verified int8 graph ({INT8_UNVERIFIED[model_type]}); float32 is "
            f"verified, and int8 for: {int8}"
        )
    switches = [name for name in EXPORT_UNVERIFIED_SWITCHES.get(model_type, ()) if getattr(config, name, False)]
    if switches:
        return (
            f"model_type={model_type!r} with {', '.join(f'{n}={getattr(config, n)!r}' for n in switches)} has no "
            f"verified ONNX export (verified decoder families, with their default settings: {verified})"
        )
    return None


def sliding_windows(config: Any) -> tuple[int | None, int | None]:
    """``(every_layer, by_layer_type)``: the window every layer's causal mask has, and the one the layers typed
    ``sliding_attention`` have (None: no window), decided as :data:`EXPORT_DECODERS` says for the family. A family
    outside it (only reached when a graph is built directly) follows its ``layer_types`` when it has them, else
    ``sliding_window``."""
    window = getattr(config, "sliding_window", None)
    window = window if isinstance(window, int) and not isinstance(window, bool) else None
    layer_types = getattr(config, "layer_types", None) or ()
    rule = EXPORT_DECODERS.get(getattr(config, "model_type", None))
    if rule is None:
        rule = WINDOW_BY_LAYER_TYPE if layer_types else WINDOW_EVERY_LAYER
    if rule == WINDOW_EVERY_LAYER:
        return window, None
    if rule == WINDOW_BY_LAYER_TYPE and "sliding_attention" in layer_types:
        return None, window
    return None, None


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that count real tokens only, so left padding does not shift them."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


class StateGraph(nn.Module):
    """``(input_ids, attention_mask) -> one states tensor per readout`` for a backbone and attention mode; the
    forward pass (and so a traced graph) stops after the deepest layer a readout reads."""

    def __init__(self, backbone: Backbone, readouts: Sequence[Readout], mode: str) -> None:
        super().__init__()
        self.model = backbone.model
        self.readouts = list(readouts)
        self.mode = mode
        self.is_decoder = backbone.is_decoder
        self.dtype = backbone.dtype
        self.norm = find_final_norm(backbone.model) if backbone.is_decoder else None
        self.needs_raw_last = backbone.is_decoder and any(
            r.final_norm is False and backbone.num_layers in r.layers for r in self.readouts
        )
        self.num_layers = backbone.num_layers
        # the graph holds only the blocks its deepest readout needs (early exit: lmembed.models.depth)
        self.depth = exit_depth((x for r in self.readouts for x in r.layers), backbone.num_layers)
        # Mistral-style models window every layer; Gemma 3 / Qwen2-style ones mix full and sliding-window layers,
        # each kind with its own mask (the torch path lets transformers build them); a bidirectional mask hides
        # only padding, except on Gemma 3's local layers (models.attention.bidirectional_window)
        self.window, self.sliding_window = sliding_windows(backbone.model.config)
        self.bidirectional_window = bidirectional_window(backbone.model.config)
        # a new module starts in training mode, and torch.onnx.export restores the mode it found: without this, an
        # export would leave the shared model training (dropout on) for the torch path that runs it next
        self.train(backbone.model.training)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kwargs: dict[str, Any] = {"input_ids": input_ids}
        if self.is_decoder:
            if self.mode == "causal":
                mask = four_d_mask(self.mode, attention_mask, self.dtype, self.window)
                local = self.sliding_window
            else:  # as the torch path's mask_for: no window, except Gemma 3's local layers
                mask = four_d_mask(self.mode, attention_mask, self.dtype)
                local = self.bidirectional_window
            if local is not None:
                sliding = four_d_mask(self.mode, attention_mask, self.dtype, local)
                kwargs["attention_mask"] = {"full_attention": mask, "sliding_attention": sliding}
            else:
                kwargs["attention_mask"] = mask
            kwargs["position_ids"] = position_ids_from_mask(attention_mask)
            kwargs["use_cache"] = False
        else:
            kwargs["attention_mask"] = attention_mask
            positions = model_position_ids(self.model, False, attention_mask)  # the family's own numbering
            if positions is not None:
                kwargs["position_ids"] = positions
        hidden_states, raw_last = forward_states(
            self.model,
            kwargs,
            depth=self.depth,
            raw_last=self.model.layers[-1] if self.needs_raw_last else None,
        )
        return tuple(
            select_states(
                hidden_states,
                r.layers,
                final_norm=r.final_norm,
                norm=self.norm,
                raw_last=raw_last,
                num_layers=self.num_layers,
            )
            for r in self.readouts
        )


@contextmanager
def attention_implementation(model: nn.Module, implementation: str) -> Iterator[None]:
    """Switch ``model``'s attention implementation for the duration (restored afterwards)."""
    config = model.config
    previous = getattr(config, "_attn_implementation", None)
    if previous == implementation or not hasattr(model, "set_attn_implementation"):
        yield
        return
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@contextmanager
def _causal_flags_off(model: nn.Module, is_decoder: bool) -> Iterator[None]:
    """The graph's own 4-D mask decides causality: kernels must not add theirs."""
    if not is_decoder:
        yield
        return
    flags = {m: m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)}
    set_causal_flags(model, causal=False)
    try:
        yield
    finally:
        for module, flag in flags.items():
            module.is_causal = flag


def export_onnx(graph: StateGraph, path: Path) -> Path:
    """Trace ``graph`` to ``path`` (ONNX, dynamic batch and sequence axes); returns ``path``."""
    model = graph.model
    device = next(model.parameters()).device
    ids = torch.full((2, 8), 5, dtype=torch.long, device=device)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a padded row, so no mask branch is traced away as constant
    names = [f"states_{i}" for i in range(len(graph.readouts))]
    axes: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "tokens"},
        "attention_mask": {0: "batch", 1: "tokens"},
    }
    axes.update({name: {0: "batch", 1: "tokens"} for name in names})
    # decoders trace SDPA where the family has it (Gemma 2 has not: eager, with its logit soft-capping)
    implementation = "sdpa" if graph.is_decoder and getattr(model, "_supports_sdpa", False) else "eager"
    with (
        attention_implementation(model, implementation),
        _causal_flags_off(model, graph.is_decoder),
        torch.no_grad(),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # tracer and legacy-exporter notices
        torch.onnx.export(
            graph,
            (ids, mask),
            str(path),
            dynamo=False,
            input_names=["input_ids", "attention_mask"],
            output_names=names,
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=True,
        )
    return path


def fuse_onnx(source: Path, target: Path, backbone: Backbone, *, attention: bool = True) -> Path:
    """ONNX Runtime's transformer optimiser on an encoder graph (fused attention, skip-LayerNorm, bias-GELU);
    ``attention=False`` keeps the attention projections as plain MatMuls (for int8 quantisation)."""
    # lazy: onnxruntime is an optional extra and loads only when an ONNX graph is built
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.enable_attention = attention
    options.enable_embed_layer_norm = False  # keeps the graph's inputs (and padding handling) as exported
    config = backbone.model.config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = optimizer.optimize_model(
            str(source),
            model_type="bert",
            num_heads=int(config.num_attention_heads),
            hidden_size=int(config.hidden_size),
            optimization_options=options,
            opt_level=0,
        )
    log.info("ONNX Runtime fusions: %s", {k: v for k, v in fused.get_fused_operator_statistics().items() if v})
    model = fused.model
    if not any(entry.domain == "com.microsoft" for entry in model.opset_import):
        model.opset_import.append(_contrib_opset())  # the fused ops live in ONNX Runtime's own domain
    save_onnx(model, target)
    return target


def _contrib_opset() -> Any:
    # lazy: onnx is an optional extra
    import onnx

    return onnx.helper.make_opsetid("com.microsoft", 1)


def save_onnx(model: Any, path: Path) -> None:
    """Write an ``onnx.ModelProto``; weights go to a side file when the graph is too large for one."""
    # lazy: onnx is an optional extra
    import onnx

    large = model.ByteSize() > EXTERNAL_DATA_BYTES
    onnx.save_model(model, str(path), save_as_external_data=large, location=path.name + ".data" if large else None)
