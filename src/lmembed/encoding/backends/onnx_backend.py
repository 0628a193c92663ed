"""The ONNX Runtime backend: float32 (fused graph) and int8 (quantised, quality-gated), CPU.

For each forward group (readouts + attention mode) the backbone is exported once to an ONNX graph that returns
exactly the states the group's strategies pool (:mod:`lmembed.encoding.backends.graph`), optimised (fused
attention, skip-LayerNorm and bias-GELU for encoders) and kept in the export cache
(:mod:`lmembed.encoding.backends.store`); later runs load it from there.

int8 needs calibration texts: those given to :meth:`OnnxBackend.calibrate` (``Embedder.calibrate``), else a
spread sample of the first texts encoded (``Backend.ensure_calibration``). Three quarters of them measure which
products quantise well (:mod:`lmembed.encoding.backends.int8`); the last quarter is held out for the quality gate
(:mod:`lmembed.encoding.backends.quality`), whose report goes into the export's manifest and
``OnnxBackend.quality``, and a warning when it fails.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from lmembed.config import EmbeddingConfig
from lmembed.encoding.backends.base import Backend, BackendError, BatchMaker, Pooler, spread_sample
from lmembed.encoding.backends.graph import (
    Readout,
    StateGraph,
    export_onnx,
    export_refusal,
    fuse_onnx,
    readout_of,
    readouts_of,
)
from lmembed.encoding.backends.int8 import CALIBRATION_MAX_TOKENS, RECIPE, quantize_graph
from lmembed.encoding.backends.quality import GateReport, announce, gate
from lmembed.encoding.backends.runtime import CPU_PROVIDERS, session_options
from lmembed.encoding.backends.store import (
    GRAPH_FILE,
    MANIFEST,
    ExportFileError,
    cached_export,
    discard_export,
    runtime_versions,
    update_manifest,
)
from lmembed.models.attention import AttentionError, check_bidirectional_supported
from lmembed.models.families import CAUSAL_TOLERANCE, probe_ids
from lmembed.models.loading import Backbone
from lmembed.schema import RecordModel, first_problem

log = logging.getLogger(__name__)

#: Bumped whenever the exported graph changes for the same inputs (keeps old cached exports from being reused).
#: 2: Mistral, Phi-3 and StarCoder2 graphs apply their sliding window.
GRAPH_FORMAT = 2
#: Share of the calibration texts held out for the quality gate.
HELD_OUT_EVERY = 4
INSTALL_HINT = "pip install 'lmembed[onnx]'"

Batches = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


def require_onnxruntime() -> None:
    """Raise :class:`BackendError` with the install command when ONNX Runtime or onnx is missing."""
    try:
        # lazy: optional extra, checked only when an ONNX backend is asked for
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise BackendError(
            f"backend='onnx' needs onnxruntime and onnx ({exc.name} is missing): {INSTALL_HINT}"
        ) from None


def check_exportable(backbone: Backbone, precision: str) -> None:
    """Refuse, before anything is traced, a decoder whose export is not verified (:data:`graph.EXPORT_DECODERS`);
    encoder families are checked by :func:`lmembed.models.families.check_verified`."""
    if not backbone.is_decoder:
        return
    reason = export_refusal(backbone.model.config, precision)
    if reason is None:
        return
    where = f"{Path(backbone.path) / 'config.json'}: " if backbone.path else ""
    raise BackendError(
        f"{where}backend='onnx' (precision={precision!r}) cannot run this model: {reason}; backend='torch' runs it"
    )


def text_fingerprint(texts: Sequence[str]) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()


@dataclass
class _Graph:
    session: Any
    index: dict[Readout, int]
    folder: Path


class OnnxBackend(Backend):
    """Runs exported graphs with ONNX Runtime on the CPU."""

    name = "onnx"

    def __init__(
        self,
        backbone: Backbone,
        precision: str = "float32",
        *,
        threads: int | None = None,
        export_root: Path | None = None,
    ) -> None:
        super().__init__(backbone)
        require_onnxruntime()
        if precision not in ("float32", "int8"):
            raise BackendError(f"backend='onnx' runs precision 'float32' or 'int8', not {precision!r}")
        if backbone.device.type != "cpu" or backbone.dtype != torch.float32:
            raise BackendError(
                "backend='onnx' exports a float32 CPU model: load it with device='cpu', dtype='float32' "
                f"(got {backbone.device.type}, {backbone.dtype})"
            )
        check_exportable(backbone, precision)
        self.precision = precision
        self.threads = threads or torch.get_num_threads()
        self.export_root = export_root
        self.calibration_texts = None
        self.quality: dict[str, GateReport] = {}  # the last prepared strategies' int8 gate reports, by label
        # every report measured for each int8 graph (a graph serves each strategy reading its layers; each is gated)
        self._gates: dict[tuple, dict[str, GateReport]] = {}
        self._graphs: dict[tuple[tuple[Readout, ...], str, str], _Graph] = {}
        self._exported_from: str | None = None  # the backbone's fingerprint the graphs in memory were exported from

    # ------------------------------------------------------------------ keys and calibration
    def cache_tag(self) -> str:
        if self.precision != "int8":
            return "onnx-float32"
        if self.calibration_texts is None:
            raise BackendError("an int8 backend needs its calibration texts before its vectors can be keyed")
        return f"onnx-int8-{text_fingerprint(self.calibration_texts)}"

    @property
    def needs_calibration(self) -> bool:
        return self.precision == "int8" and self.calibration_texts is None

    def calibrate(self, texts: Sequence[str]) -> None:
        """Calibrate int8 graphs on ``texts`` (a few hundred of the user's own texts); float32 has nothing to
        calibrate."""
        if self.precision != "int8":
            return
        sample = spread_sample(texts, len(texts))
        if len(sample) < 8:
            raise BackendError(f"int8 calibration needs at least 8 distinct texts, got {len(sample)}")
        self.calibration_texts = sample
        self._graphs = {k: v for k, v in self._graphs.items() if k[2] != "int8"}
        self._gates = {}
        self.quality = {}

    # ------------------------------------------------------------------ running
    def states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, configs: Sequence[EmbeddingConfig], mode: str
    ) -> list[torch.Tensor]:
        graph = self._graphs.get(self._key(configs, mode, self.precision))
        if graph is None:
            raise BackendError("the ONNX graph for these strategies was not prepared (call prepare first)")
        feeds = {"input_ids": input_ids.cpu().numpy(), "attention_mask": attention_mask.cpu().numpy()}
        outputs = graph.session.run(None, feeds)
        bb = self.backbone
        return [torch.from_numpy(outputs[graph.index[readout_of(c, bb.num_layers, bb.is_decoder)]]) for c in configs]

    def prepare(
        self,
        configs: Sequence[EmbeddingConfig],
        mode: str,
        batches_for: BatchMaker | None = None,
        pool: Pooler | None = None,
    ) -> None:
        # A graph holds the weights it was exported with. A model changed in place since (a training step, a
        # load_state_dict) is exported again: the old graph's vectors were served, and cached under the new key.
        self.backbone.fingerprint()  # hashed again only when the model's state moved
        weights = self.backbone.weights_fingerprint  # the weights' part: a tokenizer setting changes no graph
        if weights != self._exported_from:
            self._graphs, self._gates, self.quality = {}, {}, {}
            self._exported_from = weights
        key = self._key(configs, mode, self.precision)
        gated = self._gates.get(key, {})
        if key in self._graphs and (self.precision != "int8" or all(c.label() in gated for c in configs)):
            return
        if self.backbone.is_decoder and mode == "bidirectional":
            check_bidirectional_supported(self.backbone.model)
        readouts = tuple(readouts_of(configs, self.backbone.num_layers, self.backbone.is_decoder))
        fp32 = self._graph(readouts, mode)
        self._verify_attention(fp32, mode)
        if self.precision == "int8":
            if batches_for is None or pool is None:
                raise BackendError("int8 graphs are calibrated through the encoding engine")
            self._int8_graph(readouts, mode, fp32, configs, batches_for, pool)
            self._verify_attention(self._graphs[(readouts, mode, "int8")], mode)

    def _verify_attention(self, graph: _Graph, mode: str) -> None:
        """The attention probe of :mod:`lmembed.models.attention`, run on the graph that will execute: change the
        last token, and the first token's state must move (bidirectional) or stay put (causal)."""
        if not self.backbone.is_decoder:
            return
        ids = probe_ids(self.backbone.model, torch.device("cpu")).numpy().astype(np.int64)
        deepest = max(graph.index, key=lambda r: max(r.layers))
        if max(deepest.layers) == 0:
            return  # the embeddings alone: no attention to probe
        outputs = graph.session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        states = outputs[graph.index[deepest]]
        first = states[:, 0].astype(np.float64)
        delta = float(np.abs(first[0] - first[1]).max()) / max(1.0, float(np.abs(first).max()))
        if mode == "bidirectional" and delta <= CAUSAL_TOLERANCE:
            raise AttentionError(
                f"the exported graph attends causally although bidirectional attention was asked for ({delta:.2e})"
            )
        if mode == "causal" and delta > CAUSAL_TOLERANCE:
            raise AttentionError(f"the exported graph lets the first token see later ones ({delta:.2e})")

    def graph_folder(self, configs: Sequence[EmbeddingConfig], mode: str) -> Path | None:
        """The export folder of the prepared graph for ``configs`` (None before :meth:`prepare`)."""
        graph = self._graphs.get(self._key(configs, mode, self.precision))
        return None if graph is None else graph.folder

    # ------------------------------------------------------------------ building
    def _key(
        self, configs: Sequence[EmbeddingConfig], mode: str, precision: str
    ) -> tuple[tuple[Readout, ...], str, str]:
        readouts = tuple(readouts_of(configs, self.backbone.num_layers, self.backbone.is_decoder))
        return readouts, mode, precision

    def _parts(self, readouts: Sequence[Readout], mode: str) -> dict[str, Any]:
        bb = self.backbone
        return {
            "format": GRAPH_FORMAT,
            "weights": bb.fingerprint(),  # weights, model config and tokenizer (Backbone.fingerprint)
            "decoder": bb.is_decoder,
            "mode": mode if bb.is_decoder else "bidirectional",
            "readouts": [r.label() for r in readouts],
            "precision": "float32",
            "versions": runtime_versions(),
        }

    def _graph(self, readouts: tuple[Readout, ...], mode: str) -> _Graph:
        key = (readouts, mode, "float32")
        if key not in self._graphs:
            self._graphs[key], _ = self._cached_graph(
                self._parts(readouts, mode), lambda tmp: self._export_float32(tmp, readouts, mode), readouts
            )
        return self._graphs[key]

    def _cached_graph(
        self, parts: dict[str, Any], build: Any, readouts: Sequence[Readout]
    ) -> tuple[_Graph, dict[str, Any]]:
        """The export of ``parts`` loaded into ONNX Runtime; a cached one that does not load as lmembed wrote it
        is said, removed and built once again (one built just now that fails is refused)."""
        folder, manifest = cached_export(parts, build, self.export_root)
        try:
            return self._load(folder, readouts), manifest
        except ExportFileError as exc:
            discard_export(folder, exc)
        folder, manifest = cached_export(parts, build, self.export_root)
        return self._load(folder, readouts), manifest

    def _export_float32(self, folder: Path, readouts: Sequence[Readout], mode: str) -> dict[str, Any]:
        log.info("exporting %s to ONNX (%s)", self.backbone.name, ", ".join(r.label() for r in readouts))
        start = time.perf_counter()
        graph = StateGraph(self.backbone, readouts, mode)
        if self.backbone.is_decoder:
            export_onnx(graph, folder / GRAPH_FILE)
            fused = False
        else:
            raw = folder / "traced.onnx"
            export_onnx(graph, raw)
            fuse_onnx(raw, folder / GRAPH_FILE, self.backbone)
            raw.unlink()
            fused = True
        log.info("exported %s to ONNX in %.1f s", self.backbone.name, time.perf_counter() - start)
        return {"fused": fused}

    def _int8_graph(
        self,
        readouts: tuple[Readout, ...],
        mode: str,
        fp32: _Graph,
        configs: Sequence[EmbeddingConfig],
        batches_for: BatchMaker,
        pool: Pooler,
    ) -> None:
        texts = self.calibration_texts
        if texts is None:
            raise BackendError("int8 needs calibration texts: Embedder.calibrate(texts) or encode some texts first")
        held_out = texts[HELD_OUT_EVERY - 1 :: HELD_OUT_EVERY]
        measured = [t for i, t in enumerate(texts) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
        parts = {
            **self._parts(readouts, mode),
            "precision": "int8",
            "recipe": RECIPE,
            "calibration": text_fingerprint(texts),
            "calibration_tokens": CALIBRATION_MAX_TOKENS,
        }

        def build(tmp: Path) -> dict[str, Any]:
            start = time.perf_counter()
            batches = [(ids, mask) for ids, mask, _ in batches_for(measured)]
            manifest = quantize_graph(fp32.folder / GRAPH_FILE, tmp / GRAPH_FILE, batches, threads=self.threads)
            log.info("quantised %s to int8 in %.1f s", self.backbone.name, time.perf_counter() - start)
            return manifest

        key = (readouts, mode, "int8")
        if key in self._graphs:
            folder, manifest = cached_export(parts, build, self.export_root)
            graph = self._graphs[key]
        else:
            graph, manifest = self._cached_graph(parts, build, readouts)
            folder = graph.folder
        self._graphs[key] = graph
        # the graph serves every strategy that reads its layers: each one is gated (one measured before is read back)
        recorded = _recorded_gate(manifest, folder)
        missing = [c for c in configs if c.label() not in recorded]
        if missing:
            start = time.perf_counter()
            recorded = {**recorded, **self._measure_gate(graph, fp32, missing, mode, batches_for(held_out), pool)}
            log.info("int8 quality gate measured in %.1f s", time.perf_counter() - start)
            update_manifest(folder, quality_gate={k: r.to_dict() for k, r in recorded.items()})
        self._gates[key] = recorded
        self.quality = {c.label(): recorded[c.label()] for c in configs}
        for label, report in self.quality.items():
            announce(report, label, "int8", "use precision='float32' where this matters", stacklevel=2)

    def _measure_gate(
        self,
        int8: _Graph,
        fp32: _Graph,
        configs: Sequence[EmbeddingConfig],
        mode: str,
        batches: Batches,
        pool: Pooler,
    ) -> dict[str, GateReport]:
        bb = self.backbone
        vectors: dict[str, list[list[np.ndarray]]] = {c.label(): [[], []] for c in configs}
        for ids, mask, pool_mask in batches:
            feeds = {"input_ids": ids, "attention_mask": mask}
            for slot, graph in enumerate((fp32, int8)):
                outputs = graph.session.run(None, feeds)
                for cfg in configs:
                    states = torch.from_numpy(outputs[graph.index[readout_of(cfg, bb.num_layers, bb.is_decoder)]])
                    with torch.inference_mode():
                        pooled = pool(states, torch.from_numpy(pool_mask), cfg)
                    vectors[cfg.label()][slot].append(pooled.float().numpy())
        return {label: gate(np.concatenate(ref), np.concatenate(cand)) for label, (ref, cand) in vectors.items()}

    def _load(self, folder: Path, readouts: Sequence[Readout]) -> _Graph:
        # lazy: onnxruntime is an optional extra
        import onnxruntime as ort

        path = folder / GRAPH_FILE
        try:
            session = ort.InferenceSession(str(path), session_options(self.threads), providers=CPU_PROVIDERS)
        except Exception as exc:  # ONNX Runtime raises its own classes for a graph it cannot run
            raise ExportFileError(f"{path}: ONNX Runtime cannot load it ({type(exc).__name__}: {exc})") from None
        _check_outputs(path, session, len(readouts), self.backbone.hidden_size)
        return _Graph(session, {r: i for i, r in enumerate(readouts)}, folder)


def _check_outputs(path: Path, session: Any, count: int, width: int) -> None:
    """The graph returns one state per readout, each ``[batch, tokens, width]``; else :class:`ExportFileError`.
    A width the graph leaves symbolic is measured on a two-token input."""
    outputs = session.get_outputs()
    if len(outputs) != count:
        raise ExportFileError(f"{path}: the graph returns {len(outputs)} outputs, the export has {count} readouts")
    shapes = [list(out.shape or []) for out in outputs]
    if not all(len(shape) == 3 and isinstance(shape[-1], int) for shape in shapes):
        ids = np.ones((1, 2), dtype=np.int64)
        try:
            states = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        except Exception as exc:  # ONNX Runtime raises its own classes for a graph it cannot run
            raise ExportFileError(f"{path}: ONNX Runtime cannot run it ({type(exc).__name__}: {exc})") from None
        shapes = [list(np.shape(state)) for state in states]
    for out, shape in zip(outputs, shapes, strict=True):
        if len(shape) != 3 or shape[-1] != width:
            raise ExportFileError(
                f"{path}: output {out.name!r} has shape {shape}; the model's states are [batch, tokens, {width}]"
            )


class _RecordedReport(RecordModel):
    """One gate report as :meth:`GateReport.to_dict` writes it: strict types, finite numbers in their ranges."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    texts: int = Field(ge=0)
    min_cosine: float = Field(ge=-1.0, le=1.0)
    mean_cosine: float = Field(ge=-1.0, le=1.0)
    neighbour_ndcg_at_10: float = Field(ge=0.0, le=1.0)
    passed: bool | None = None


_RECORDED_GATE = TypeAdapter(dict[str, _RecordedReport])


def _recorded_gate(manifest: dict[str, Any], folder: Path) -> dict[str, GateReport]:
    """The gate reports an int8 graph's manifest holds, by strategy label; none where it holds none, or holds them
    in another shape or with values lmembed never writes (said, naming the field, and the gate is measured again)."""
    raw = manifest.get("quality_gate")
    if raw is None:
        return {}
    try:
        reports = _RECORDED_GATE.validate_python(raw)
    except ValidationError as exc:
        log.warning(
            "%s: quality_gate is not as lmembed writes it (quality_gate.%s, got %r); the gate is measured again",
            folder / MANIFEST,
            first_problem(exc),
            exc.errors()[0].get("input"),
        )
        return {}
    return {
        label: GateReport(r.texts, r.min_cosine, r.mean_cosine, r.neighbour_ndcg_at_10) for label, r in reports.items()
    }
