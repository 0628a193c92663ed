"""The backend interface, and the torch backend (the reference every other backend is compared with).

A backend runs the transformer: given a padded batch (token ids, attention mask) and the strategies of one
forward group, it returns, per strategy, the token states that strategy pools (its layers, averaged, through
the final norm or not). The engine pools them, so pooling is the same code on every backend.

What a backend can do beyond that is declared here, with defaults for a backend that has no such step, so the
engine, the Embedder and the evaluation runner ask every backend the same questions and never probe for
attributes or branch on the backend's class:

* :meth:`Backend.prepare`: get ready for a forward group (set the attention, export, calibrate);
* :attr:`Backend.needs_calibration`, :meth:`Backend.calibrate`, :meth:`Backend.ensure_calibration` and
  :attr:`Backend.calibration_texts`: int8's calibration texts (no-ops and None at float precisions);
* :meth:`Backend.graph_folder`: the exported graph's folder (None where nothing is exported);
* :attr:`Backend.differentiable`: whether training's forward pass can run on it.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lmembed.config import BACKENDS as BACKENDS
from lmembed.config import PRECISIONS as PRECISIONS
from lmembed.config import EmbeddingConfig
from lmembed.errors import ConfigError
from lmembed.models.attention import configure_attention, configured_mode, mask_for
from lmembed.models.depth import exit_depth, forward_states
from lmembed.models.families import (
    AFTER_PADDING,
    check_verified,
    forward_parameters,
    position_convention,
    position_ids,
)
from lmembed.models.loading import Backbone
from lmembed.pooling.layers import find_final_norm, normalize_layer, select_states

log = logging.getLogger(__name__)

# Backends lmembed can run a model on, and the precisions: the backbone's own floating types, and int8 (quantised,
# quality-gated). The registry lives in lmembed.config, free of torch, so the CLI reads it without importing torch;
# it is re-exported here (BACKENDS, PRECISIONS) for the backends.

#: ``batches_for(texts)``: the engine's tokenisation of calibration texts into padded numpy batches
#: (input_ids, attention_mask, pool_mask).
BatchMaker = Callable[[Sequence[str]], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]
#: ``pool(states, pool_mask, config)``: the engine's pooling.
Pooler = Callable[[torch.Tensor, torch.Tensor, EmbeddingConfig], torch.Tensor]
#: Calibration texts sampled from the first encode call when none were given.
CALIBRATION_TEXTS = 256
#: The torch cache tag of a family numbering positions after ``padding_idx`` (RoBERTa, XLM-R, MPNet ...): lmembed
#: gave them positions from 0 before, and the embedding cache must not serve the vectors it computed then.
AFTER_PADDING_TAG = "pos-after-padding"


class BackendError(ConfigError):
    """A backend/precision combination this installation or model cannot run."""


def spread_sample(texts: Sequence[str], size: int) -> list[str]:
    """``size`` distinct texts spread evenly over ``texts`` (all of them when there are fewer)."""
    unique = list(dict.fromkeys(texts))
    if len(unique) <= size:
        return unique
    step = len(unique) / size
    return [unique[int(i * step)] for i in range(size)]


class Backend(ABC):
    """Runs a backbone's forward pass and returns the states each strategy pools."""

    name: str = ""
    precision: str = "float32"
    #: The texts this backend is calibrated on; None where it has none (not calibrated yet, or nothing to calibrate).
    calibration_texts: list[str] | None = None
    #: Whether gradients flow through :meth:`states` (training's forward pass runs on such a backend).
    differentiable: bool = False
    #: int8's quality gate report by strategy label (ONNX Runtime's on held-out calibration texts, torch's at load);
    #: empty where nothing was gated. Each backend holds its own (set in ``__init__``).
    quality: dict[str, Any] = {}  # noqa: RUF012

    def __init__(self, backbone: Backbone) -> None:
        self.backbone = backbone
        self.quality = {}

    @property
    def needs_calibration(self) -> bool:
        """True while the backend must be calibrated before it can encode (int8 without calibration texts)."""
        return False

    def calibrate(self, texts: Sequence[str]) -> None:  # noqa: B027
        """Calibrate on ``texts`` (a few hundred of the user's own); a backend with nothing to calibrate ignores
        them."""

    def ensure_calibration(self, texts: Sequence[str]) -> None:
        """Before an encode: where :attr:`needs_calibration`, calibrate on a spread sample of ``texts`` (at most
        :data:`CALIBRATION_TEXTS`)."""
        if self.needs_calibration:
            self.calibrate(spread_sample(texts, CALIBRATION_TEXTS))
            calibrated = len(self.calibration_texts or [])
            log.info("%s: calibrating on %d of the texts being encoded", self.precision, calibrated)

    def cache_tag(self) -> str:
        """What, besides the weights and the strategy, decides this backend's vectors ('' = the torch
        reference at the backbone's own dtype). Part of the embedding-cache key."""
        return f"{self.name}-{self.precision}"

    @abstractmethod
    def states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, configs: Sequence[EmbeddingConfig], mode: str
    ) -> list[torch.Tensor]:
        """One (batch, tokens, dim) tensor per config: the states it pools."""

    def prepare(  # noqa: B027
        self,
        configs: Sequence[EmbeddingConfig],
        mode: str,
        batches_for: BatchMaker | None = None,
        pool: Pooler | None = None,
    ) -> None:
        """Get ready to run ``configs`` in ``mode`` (set the attention, export, calibrate); called before each
        forward group with the engine's tokenisation and pooling, for backends that calibrate."""

    def graph_folder(self, configs: Sequence[EmbeddingConfig], mode: str) -> Path | None:
        """The export folder of the prepared graph that runs ``configs`` in ``mode``; None for a backend that runs
        no exported graph."""
        return None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.name, "precision": self.precision}
        if self.quality:
            out["quality_gate"] = {label: report.to_dict() for label, report in self.quality.items()}
        return out


class TorchBackend(Backend):
    """The transformers model itself, in PyTorch (CPU or GPU, at the backbone's dtype; differentiable)."""

    name = "torch"
    differentiable = True

    def __init__(self, backbone: Backbone, precision: str | None = None) -> None:
        super().__init__(backbone)
        self.precision = precision or dtype_name(backbone.dtype)
        check_verified(backbone.model, backbone.is_decoder, "torch")
        params = forward_parameters(backbone.model)
        # positions the way the model's own forward numbers them (families.ENCODER_FAMILIES; decoders: 0, 1, 2 ...
        # over the real tokens), so that padding on either side gives each token the position it has alone
        self._positions = position_convention(backbone.model, backbone.is_decoder)
        self._padding_idx = getattr(backbone.model.config, "pad_token_id", None)
        self._accepts_cache_flag = "use_cache" in params

    def cache_tag(self) -> str:
        # The weights fingerprint already covers dtype and torch's own int8 modules: the reference adds nothing,
        # except for the families whose positions lmembed once numbered from 0 (their vectors cached then are wrong)
        return AFTER_PADDING_TAG if self._positions == AFTER_PADDING else ""

    def prepare(
        self,
        configs: Sequence[EmbeddingConfig],
        mode: str,
        batches_for: BatchMaker | None = None,
        pool: Pooler | None = None,
    ) -> None:
        """Switch a decoder's attention to ``mode``. The mode lives on the model, which several engines
        (Embedders) may share and switch in turn."""
        model = self.backbone.model
        if self.backbone.is_decoder and configured_mode(model) != mode:
            configure_attention(model, mode, verify=True)

    def states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, configs: Sequence[EmbeddingConfig], mode: str
    ) -> list[torch.Tensor]:
        """The pass stops after the deepest layer any of ``configs`` reads (:mod:`lmembed.models.depth`)."""
        backbone = self.backbone
        num_layers = backbone.num_layers
        read = {normalize_layer(x, num_layers) for c in configs for x in c.layers}
        need_raw_last = backbone.is_decoder and any(
            c.final_norm is False and num_layers in {normalize_layer(x, num_layers) for x in c.layers} for c in configs
        )
        hidden_states, raw_last = self.run_model(
            input_ids, attention_mask, mode, need_raw_last, depth=exit_depth(read, num_layers)
        )
        norm = find_final_norm(backbone.model) if backbone.is_decoder else None
        return [
            select_states(
                hidden_states,
                cfg.layers,
                final_norm=cfg.final_norm,
                norm=norm,
                raw_last=raw_last,
                num_layers=num_layers,
            )
            for cfg in configs
        ]

    def run_model(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mode: str,
        need_raw_last: bool,
        *,
        depth: int | None = None,
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        """Hidden states of the first ``depth`` blocks (all of them by default; see
        :func:`~lmembed.models.depth.forward_states`) and, when asked, the last block's raw output."""
        model = self.backbone.model
        kwargs: dict[str, Any] = {"input_ids": input_ids}
        if self.backbone.is_decoder:
            kwargs["attention_mask"] = mask_for(mode, attention_mask, self.backbone.dtype, model.config)
        else:
            kwargs["attention_mask"] = attention_mask
        positions = position_ids(self._positions, attention_mask, self._padding_idx)
        if positions is not None:
            kwargs["position_ids"] = positions
        if self._accepts_cache_flag and self.backbone.is_decoder:
            kwargs["use_cache"] = False
        return forward_states(
            model,
            kwargs,
            depth=self.backbone.num_layers if depth is None else depth,
            raw_last=_last_layer(model) if need_raw_last else None,
        )


def dtype_name(dtype: torch.dtype) -> str:
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    return names.get(dtype, str(dtype).removeprefix("torch."))


def _last_layer(model: nn.Module) -> nn.Module:
    layers = getattr(model, "layers", None)
    if layers is None or len(layers) == 0:
        raise ConfigError("final_norm=False on the last layer needs a decoder with a `layers` module list")
    return layers[-1]
