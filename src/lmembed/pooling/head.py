"""The post-pooling head of a published model: the Dense, LayerNorm and Normalize layers a sentence-transformers
stack applies to the pooled vector, described declaratively by ``EmbeddingConfig.head``.

Each layer may belong to one route of an asymmetric (Router) model: it then runs only when the strategy's
``route`` names that route (queries and documents read through different layers); layers without a route
always run. The weights are ordinary ``nn`` parameters, so the head trains and saves like the backbone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmembed.errors import ModelLoadError

ACTIVATION_MODULES: dict[str, type[nn.Module]] = {
    "identity": nn.Identity,
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
    "silu": nn.SiLU,
}


class DenseLayer(nn.Module):
    """``activation(linear(x))`` (+ ``x`` or a projection of it when ``residual``), as sentence-transformers'
    Dense; parameter names follow its saved files (``linear.*``, ``residual.*``)."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__()
        n_in, n_out = int(spec["in_features"]), int(spec["out_features"])
        self.linear = nn.Linear(n_in, n_out, bias=bool(spec.get("bias", True)))
        self.activation = ACTIVATION_MODULES[spec.get("activation", "identity")]()
        self.use_residual = bool(spec.get("residual", False))
        if self.use_residual and n_in != n_out:
            self.residual = nn.Linear(n_in, n_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


class LayerNormLayer(nn.Module):
    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(int(spec["dimension"]), eps=float(spec.get("eps", 1e-5)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class NormalizeLayer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, p=2, dim=-1)


LAYERS: dict[str, type[nn.Module]] = {"dense": DenseLayer, "layer_norm": LayerNormLayer, "normalize": NormalizeLayer}


def build_layer(spec: Mapping[str, Any]) -> nn.Module:
    layer_class = LAYERS[spec["type"]]
    return layer_class() if layer_class is NormalizeLayer else layer_class(spec)


class PostPoolingHead(nn.Module):
    """The layers of ``specs`` (``EmbeddingConfig.head``) in order; ``forward(x, route)`` skips the layers of
    other routes."""

    def __init__(self, specs: Sequence[Mapping[str, Any]]) -> None:
        super().__init__()
        self.specs = [dict(spec) for spec in specs]
        self.layers = nn.ModuleList(build_layer(spec) for spec in self.specs)

    def forward(self, pooled: torch.Tensor, route: str | None = None) -> torch.Tensor:
        for spec, layer in zip(self.specs, self.layers, strict=True):
            if spec.get("route") in (None, route):
                pooled = layer(pooled)
        return pooled

    def output_dim(self, input_dim: int, route: str | None = None) -> int:
        """The width of the vectors this head returns for ``route`` from pooled vectors of ``input_dim``."""
        dim = input_dim
        for spec in self.specs:
            if spec.get("route") in (None, route) and spec["type"] == "dense":
                dim = int(spec["out_features"])
        return dim

    def layer_state(self, index: int) -> dict[str, torch.Tensor]:
        """The weights of layer ``index`` under sentence-transformers' names (empty for Normalize)."""
        return {k: v.detach().cpu().contiguous() for k, v in self.layers[index].state_dict().items()}

    def load_layer_state(self, index: int, state: Mapping[str, torch.Tensor], source: str) -> None:
        """Load layer ``index``'s weights; a :class:`~lmembed.errors.ModelLoadError` naming ``source`` (the layer's
        folder or file) and the tensors at fault when they are not exactly the layer's, name for name and shape for
        shape (a tensor too many is refused as well as one missing: the weights are not the layer's)."""
        layer = self.layers[index]
        own = layer.state_dict()
        wanted = {k: tuple(v.shape) for k, v in own.items()}
        found = {k: tuple(v.shape) for k, v in state.items()}
        faults = [f"{k} (not a tensor of this layer)" for k in sorted(set(found) - set(wanted))]
        faults += [f"{k} (missing)" for k in sorted(set(wanted) - set(found))]
        misshapen = [k for k in wanted if k in found and found[k] != wanted[k]]
        faults += [f"{k} of shape {list(found[k])}, not {list(wanted[k])}" for k in misshapen]
        if faults:
            needed = ", ".join(f"{k} {list(shape)}" for k, shape in wanted.items())
            raise ModelLoadError(
                f"{source}: the weights do not fit head layer {index} ({self.specs[index]['type']}): "
                f"{'; '.join(faults)}; it needs exactly {needed}"
            )
        layer.load_state_dict(dict(state))
