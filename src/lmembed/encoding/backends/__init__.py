"""Backends that run the transformer for the encoding engine, behind one small interface (``base.Backend``).

* ``torch`` (``base.TorchBackend``): the transformers model in PyTorch, CPU or GPU, at the backbone's dtype; the
  reference, and the only differentiable one (training uses it);
* ``onnx`` (``onnx_backend.OnnxBackend``): an exported graph (``graph``) run by ONNX Runtime on the CPU
  (``runtime``), float32 with fused attention/LayerNorm/GELU, or int8 (the ``int8`` package: rounding,
  calibration, graph rewriting, the recipe) checked by a quality gate (``quality``); exports are cached on disk
  (``store``);
* ``cuda-graphs`` (``cuda_graphs.CudaGraphBackend``): the torch model on a GPU, each batch widened to a bucketed
  shape whose forward pass is captured once as a CUDA graph and replayed (the host launches one graph instead of
  every kernel).

Pooling is never part of a backend: each returns the token states a strategy pools, and the engine pools them.
What else a backend can do (calibrate, export a graph) is declared on ``base.Backend``; a new backend subclasses
it and its builder is registered in :data:`BUILDERS` (and its name in ``config.BACKENDS`` for the command line).
"""

from __future__ import annotations

from collections.abc import Callable

from lmembed.encoding.backends.base import BACKENDS, PRECISIONS, Backend, BackendError, TorchBackend, dtype_name
from lmembed.io import is_whole_number
from lmembed.models.families import check_verified
from lmembed.models.loading import Backbone

__all__ = ["BACKENDS", "BUILDERS", "PRECISIONS", "Backend", "BackendError", "TorchBackend", "make_backend"]


def _torch(backbone: Backbone, precision: str | None, threads: int | None) -> Backend:
    if threads is not None:
        raise BackendError(
            f"threads={threads} sets ONNX Runtime's threads (backend='onnx'); the torch backend uses torch's "
            "(torch.set_num_threads)"
        )
    native = TorchBackend(backbone)
    if precision not in (None, native.precision) and not (precision == "int8" and _torch_int8(backbone)):
        raise BackendError(
            f"backend='torch' runs the model at its loaded dtype ({native.precision}); load it with "
            f"dtype={precision!r} instead, or use backend='onnx' for int8"
        )
    if _torch_int8(backbone):
        native.precision = "int8"
    return native


def _cuda_graphs(backbone: Backbone, precision: str | None, threads: int | None) -> Backend:
    # lazy, as ONNX: the module is only needed where a GPU runs it
    from lmembed.encoding.backends.cuda_graphs import CudaGraphBackend

    if _torch_int8(backbone) or precision == "int8":
        raise BackendError("backend='cuda-graphs' runs float models; int8 runs on backend='onnx' (or 'torch' on a CPU)")
    native = dtype_name(backbone.dtype)
    if precision not in (None, native):
        raise BackendError(
            f"backend='cuda-graphs' runs the model at its loaded dtype ({native}); load it with dtype={precision!r}"
        )
    return CudaGraphBackend(backbone)


def _onnx(backbone: Backbone, precision: str | None, threads: int | None) -> Backend:
    # lazy: keeps onnxruntime out of `import lmembed` and of the torch-only path
    from lmembed.encoding.backends.onnx_backend import OnnxBackend

    check_verified(backbone.model, backbone.is_decoder, "int8" if precision == "int8" else "onnx")
    return OnnxBackend(backbone, precision or "float32", threads=threads)


#: Each backend's builder ``(backbone, precision, threads) -> Backend``: the one place a backend is built
#: (``BACKENDS``, torch-free in :mod:`lmembed.config`, holds the names the command line accepts).
BUILDERS: dict[str, Callable[[Backbone, str | None, int | None], Backend]] = {
    "torch": _torch,
    "onnx": _onnx,
    "cuda-graphs": _cuda_graphs,
}


def make_backend(
    backbone: Backbone, backend: str | None = None, precision: str | None = None, *, threads: int | None = None
) -> Backend:
    """The backend named ``backend`` at ``precision``. Defaults: torch at the backbone's own dtype; int8 without a
    backend named runs on ONNX Runtime."""
    if backend is not None and backend not in BUILDERS:
        raise BackendError(f"backend={backend!r} is unknown; choose one of {', '.join(BUILDERS)}")
    if precision is not None and precision not in PRECISIONS:
        raise BackendError(f"precision={precision!r} is unknown; choose one of {', '.join(PRECISIONS)}")
    if threads is not None and (not is_whole_number(threads) or not 1 <= threads <= 1024):
        raise BackendError(f"threads={threads!r} must be a whole number of threads from 1 to 1024, or None")
    backend = backend or ("onnx" if precision == "int8" and not _torch_int8(backbone) else "torch")
    return BUILDERS[backend](backbone, precision, threads)


def _torch_int8(backbone: Backbone) -> bool:
    """True when the backbone was loaded with torch's own dynamic int8 modules (``quantize='int8'`` with the
    torch backend)."""
    return backbone.quantization == "int8"
