"""Where encoding time goes: tokenisation, padding, and the forward pass op by op (torch and ONNX Runtime).

For ``--model`` (default ``minilm``) on ``--n`` real texts (the encode_throughput mix), batch ``--batch-size``:

1. tokenisation: lmembed's per-text input building vs the batched one (``InputBuilder.build_all``);
2. padding: real tokens vs padded tokens with length-sorted batches;
3. torch forward: ``torch.profiler`` self CPU time per op, grouped (matrix products, attention, GELU,
   LayerNorm/RMSNorm, copies, element-wise, other);
4. ONNX Runtime forward (the graph ``backend="onnx"`` runs): its profiler's time per node type.

Results: ``bench/results/profile-encode/<model>.json`` and ``.md``.

    python bench/profile_encode.py --n 300
    python bench/profile_encode.py --model smollm2-135m --n 64 --max-length 256
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from _common import REPO
from encode_throughput import load_texts

OUT = REPO / "bench" / "results" / "profile-encode"
GROUPS = {
    "matrix products": ("addmm", "mm", "bmm", "matmul", "linear", "MatMul", "Gemm", "FusedMatMul"),
    "attention": ("scaled_dot_product", "flash_attention", "Attention", "Softmax", "softmax"),
    "GELU / SiLU": ("gelu", "Gelu", "silu", "Silu", "Sigmoid", "BiasGelu", "FastGelu"),
    "LayerNorm / RMSNorm": (
        "layer_norm",
        "LayerNorm",
        "SkipLayerNormalization",
        "SimplifiedLayerNormalization",
        "rsqrt",
        "pow",
        "mean",
        "Pow",
        "ReduceMean",
        "Sqrt",
    ),
    "copies / layout": (
        "copy_",
        "contiguous",
        "clone",
        "Transpose",
        "Reshape",
        "Concat",
        "Expand",
        "index_select",
        "Gather",
        "cat",
    ),
    "element-wise": ("add", "mul", "div", "sub", "where", "Add", "Mul", "Div", "Sub", "Where", "Cast", "tanh"),
}


def group_of(name: str) -> str:
    for group, keys in GROUPS.items():
        if any(k in name for k in keys):
            return group
    return "other"


def batches_of(features, batch_size: int, pad_id: int):
    from lmembed.encoding.engine import collate, plan_batches

    for chunk in plan_batches([len(f) for f in features], batch_size):
        yield collate([features[j] for j in chunk], pad_id, "right", torch.device("cpu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=None)
    args = parser.parse_args()

    from lmembed import Embedder
    from lmembed.encoding.inputs import InputBuilder

    texts = load_texts(2000)[:: max(1, 2000 // args.n)][: args.n]
    emb = Embedder.from_pretrained(args.model, cache=False, show_progress=False, max_length=args.max_length)
    bb, cfg = emb.backbone, emb.config
    builder = InputBuilder(bb.tokenizer, cfg, is_decoder=bb.is_decoder, max_length=cfg.max_length)
    result: dict = {
        "model": args.model,
        "texts": len(texts),
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
    }

    start = time.perf_counter()
    one_by_one = [builder.build(t) for t in texts]
    t_single = time.perf_counter() - start
    start = time.perf_counter()
    batched = builder.build_all(texts)
    t_batched = time.perf_counter() - start
    assert batched == one_by_one
    lengths = sorted((len(f) for f in batched), reverse=True)
    padded = sum(
        max(lengths[i : i + args.batch_size]) * len(lengths[i : i + args.batch_size])
        for i in range(0, len(lengths), args.batch_size)
    )
    result["tokenisation_s"] = {"per_text": t_single, "batched": t_batched}
    result["tokens"] = {"real": sum(lengths), "padded": padded, "padding_share": 1 - sum(lengths) / padded}

    pad_id = emb.engine.pad_id
    mode = cfg.attention if bb.is_decoder else "bidirectional"
    backend = emb.engine.backend
    with torch.inference_mode():
        for ids, attn, _ in list(batches_of(batched, args.batch_size, pad_id))[:1]:
            backend.states(ids, attn, [cfg], mode)  # warm-up
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
        start = time.perf_counter()
        for ids, attn, _ in batches_of(batched, args.batch_size, pad_id):
            backend.states(ids, attn, [cfg], mode)
        t_torch = time.perf_counter() - start
    by_group: dict[str, float] = defaultdict(float)
    top = []
    for event in prof.key_averages():
        if event.key.startswith("aten::") or event.key.startswith("ProfilerStep"):
            self_us = event.self_cpu_time_total
            by_group[group_of(event.key)] += self_us / 1e6
            top.append((event.key, self_us / 1e6, event.count))
    total = sum(by_group.values())
    result["torch"] = {
        "forward_s": t_torch,
        "share": {g: v / total for g, v in sorted(by_group.items(), key=lambda kv: -kv[1])},
        "top_ops": [{"op": k, "self_s": s, "calls": c} for k, s, c in sorted(top, key=lambda x: -x[1])[:12]],
    }

    try:
        import onnxruntime as ort

        from lmembed.encoding.backends.runtime import session_options
    except ImportError:
        result["onnx"] = "onnxruntime not installed"
    else:
        onnx_emb = Embedder.from_pretrained(
            args.model, cache=False, show_progress=False, max_length=args.max_length, backend="onnx"
        )
        folder = onnx_emb.engine.prepare_backend([onnx_emb.config])
        with tempfile.TemporaryDirectory() as tmp:
            options = session_options(torch.get_num_threads())
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(tmp) / "ort")
            session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
            start = time.perf_counter()
            for ids, attn, _ in batches_of(batched, args.batch_size, pad_id):
                session.run(None, {"input_ids": ids.numpy(), "attention_mask": attn.numpy()})
            t_ort = time.perf_counter() - start
            trace = json.loads(Path(session.end_profiling()).read_text())
        per_type: dict[str, float] = defaultdict(float)
        for event in trace:
            if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
                per_type[event["args"].get("op_name", "?")] += event["dur"] / 1e6
        total = sum(per_type.values())
        result["onnx"] = {
            "forward_s": t_ort,
            "ratio_vs_torch": t_torch / t_ort,
            "share_by_node_type": {k: v / total for k, v in sorted(per_type.items(), key=lambda kv: -kv[1])[:12]},
        }

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.model}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# where the time goes: {args.model}, {len(texts)} texts, batch {args.batch_size}, "
        f"{result['threads']} threads (load average {result['load_average'][0]:.1f})",
        "",
        f"- tokenisation: per text {t_single:.2f}s, batched {t_batched:.2f}s ({t_single / t_batched:.1f}x)",
        f"- padding: {result['tokens']['padding_share']:.1%} of {padded} padded tokens (length-sorted batches)",
        f"- torch forward {t_torch:.1f}s, self time by group: "
        + ", ".join(f"{g} {v:.0%}" for g, v in result["torch"]["share"].items()),
    ]
    if isinstance(result["onnx"], dict):
        lines.append(
            f"- ONNX Runtime forward {result['onnx']['forward_s']:.1f}s "
            f"({result['onnx']['ratio_vs_torch']:.2f}x torch), kernel time by node type: "
            + ", ".join(f"{k} {v:.0%}" for k, v in result["onnx"]["share_by_node_type"].items())
        )
    (OUT / f"{args.model}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
