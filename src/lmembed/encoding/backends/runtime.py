"""How lmembed runs ONNX graphs with ONNX Runtime: the session settings shared by the backend's sessions and
int8 calibration's recording session."""

from __future__ import annotations

from typing import Any

CPU_PROVIDERS = ["CPUExecutionProvider"]


def session_options(threads: int) -> Any:
    """ONNX Runtime session options: ``threads`` intra-op threads, no spinning (the cores are shared), every
    graph optimisation on."""
    # lazy: onnxruntime is an optional extra
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options
