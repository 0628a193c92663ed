"""Encoding throughput: lmembed's backends vs sentence-transformers' on the same real texts, in one run.

Contenders (all on the CPU, ``--batch-size`` texts per batch, vectors L2-normalised; ``--tag`` names the result files):

* sentence-transformers: ``st-torch`` (its default backend) in this environment; ``st-onnx``, ``st-onnx-O3``
  (graph optimisation level O3) and ``st-onnx-int8`` (``export_dynamic_quantized_onnx_model(..., "avx2")``) from
  a second Python given by ``--st-onnx-python`` (sentence-transformers' ONNX extra needs optimum-onnx, which
  pins an older transformers than lmembed's: keep it in its own virtual environment); the run says so when the
  ONNX rows are absent;
* lmembed ``torch`` float32, ``onnx`` float32 (fused graph) and ``onnx`` int8 (calibrated on 256 of the texts).

Rounds are interleaved (every contender once per round, ``--repeats`` rounds) and each figure is the median
over rounds; ratios are taken within this run. Agreement: min cosine of lmembed float32 vectors to
``st-torch``'s, of int8 vectors to lmembed torch float32's. With ``--decoder-texts N`` the decoder
``smollm2-135m`` is also timed on N texts with the main job's four strategies (one forward pass), torch float32
vs onnx float32 vs onnx int8. ``--engine serial|pipelined`` (default pipelined) picks lmembed's encoding engine
path (``EncodingEngine.pipelined``). Results: ``bench/results/encode-throughput/result.json`` and ``table.md``.

    python bench/encode_throughput.py --n 2000 --repeats 3 --st-onnx-python /tmp/st-onnx-venv/bin/python \\
        --decoder-texts 200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from _common import REPO, read_jsonl, shared_or_exit

OUT = REPO / "bench" / "results" / "encode-throughput"


def load_texts(n: int) -> list[str]:
    """Half short sentences (STSBenchmark), half abstracts (SciFact corpus): a realistic length mix."""
    sts = read_jsonl(shared_or_exit("sts/stsbenchmark/test.jsonl"))
    docs = read_jsonl(shared_or_exit("beir/scifact/corpus.jsonl"), limit=n)
    short = [r["sentence1"] for r in sts][: n // 2]
    long = [(d.get("title", "") + " " + d["text"]).strip() for d in docs][: n - len(short)]
    return short + long


# ---------------------------------------------------------------------------- sentence-transformers ONNX worker
def worker(model_dir: str, n: int, batch_size: int) -> None:
    """Runs in the second Python: loads sentence-transformers' ONNX backends and times them on request."""
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model
    from sentence_transformers.backend import export_optimized_onnx_model

    texts = load_texts(n)
    work = Path(tempfile.mkdtemp(prefix="st-onnx-"))
    local = work / "model"
    shutil.copytree(model_dir, local, ignore=shutil.ignore_patterns("onnx", "*.onnx"))
    base = SentenceTransformer(str(local), device="cpu", backend="onnx")
    base.save(str(local))  # keeps onnx/model.onnx beside the weights
    export_optimized_onnx_model(base, "O3", str(local))
    export_dynamic_quantized_onnx_model(base, "avx2", str(local))
    quantized = next((local / "onnx").glob("model_*int8_avx2.onnx")).relative_to(local)
    models = {
        "st-onnx": base,
        "st-onnx-O3": SentenceTransformer(
            str(local), device="cpu", backend="onnx", model_kwargs={"file_name": "onnx/model_O3.onnx"}
        ),
        "st-onnx-int8": SentenceTransformer(
            str(local), device="cpu", backend="onnx", model_kwargs={"file_name": str(quantized)}
        ),
    }
    for model in models.values():
        model.encode(texts[:64], batch_size=batch_size)
    print(json.dumps({"ready": sorted(models)}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        start = time.perf_counter()
        vectors = models[request["name"]].encode(texts, batch_size=batch_size, normalize_embeddings=True)
        seconds = time.perf_counter() - start
        np.save(request["out"], np.asarray(vectors, dtype=np.float32))
        print(json.dumps({"seconds": seconds}), flush=True)


class RemoteContenders:
    """The worker process, seen as contenders ``name -> () -> vectors`` (it reports its own timing)."""

    def __init__(self, python: str, model_dir: str, n: int, batch_size: int) -> None:
        self.proc = subprocess.Popen(
            [python, __file__, "--worker", model_dir, "--n", str(n), "--batch-size", str(batch_size)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent,
        )
        line = self._read()
        self.names = json.loads(line)["ready"]
        self.tmp = Path(tempfile.mkdtemp(prefix="st-onnx-vectors-"))

    def _read(self) -> str:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the sentence-transformers ONNX worker exited")
            if line.startswith("{"):
                return line

    def run(self, name: str) -> tuple[np.ndarray, float]:
        assert self.proc.stdin is not None
        out = self.tmp / f"{name}.npy"
        self.proc.stdin.write(json.dumps({"name": name, "out": str(out)}) + "\n")
        self.proc.stdin.flush()
        seconds = json.loads(self._read())["seconds"]
        return np.load(out), seconds

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---------------------------------------------------------------------------- timing
def timed(fn: Callable[[], np.ndarray]) -> tuple[np.ndarray, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def interleave(contenders: dict[str, Callable[[], tuple[np.ndarray, float]]], repeats: int) -> tuple[dict, dict]:
    """Every contender once per round; returns (seconds per contender per round, last vectors)."""
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    vectors: dict[str, np.ndarray] = {}
    for round_ in range(repeats):
        for name, run in contenders.items():
            vectors[name], took = run()
            seconds[name].append(took)
            print(f"  round {round_ + 1}: {name:14s} {took:7.1f}s", flush=True)
    return seconds, vectors


def minilm_section(args: argparse.Namespace) -> dict:
    from sentence_transformers import SentenceTransformer

    from lmembed import Embedder

    texts = load_texts(args.n)
    fp32 = Embedder.from_pretrained("minilm", cache=False, show_progress=False)
    tokens = sum(len(f) for f in _features(fp32, texts))
    onnx32 = Embedder.from_pretrained("minilm", cache=False, show_progress=False, backend="onnx")
    int8 = Embedder.from_pretrained("minilm", cache=False, show_progress=False, precision="int8")
    int8.calibrate(texts[1::7][:256])
    for emb in (fp32, onnx32, int8):
        emb.engine.pipelined = args.engine == "pipelined"
    st = SentenceTransformer(fp32.backbone.path, device="cpu")
    bs = args.batch_size
    local: dict[str, Callable[[], np.ndarray]] = {
        "st-torch": lambda: st.encode(texts, batch_size=bs, normalize_embeddings=True),
        "lmembed-torch": lambda: fp32.encode(texts, batch_size=bs),
        "lmembed-onnx": lambda: onnx32.encode(texts, batch_size=bs),
        "lmembed-int8": lambda: int8.encode(texts, batch_size=bs),
    }
    warm = {"st-torch": st, "lmembed-torch": fp32, "lmembed-onnx": onnx32, "lmembed-int8": int8}
    for name, model in warm.items():  # warm-up, and the one-off export and calibration of the ONNX graphs
        start = time.perf_counter()
        model.encode(texts[:64], batch_size=bs)
        print(f"warm-up {name}: {time.perf_counter() - start:.1f}s", flush=True)
    contenders: dict[str, Callable[[], tuple[np.ndarray, float]]] = {
        name: (lambda run=run: timed(run)) for name, run in local.items()
    }
    remote = None
    if args.st_onnx_python:
        remote = RemoteContenders(args.st_onnx_python, fp32.backbone.path, args.n, bs)
        for name in remote.names:
            contenders[name] = lambda name=name: remote.run(name)
    try:
        seconds, vectors = interleave(contenders, args.repeats)
    finally:
        if remote is not None:
            remote.close()
    median = {name: float(np.median(s)) for name, s in seconds.items()}
    rate = {name: len(texts) / s for name, s in median.items()}
    st_fp32 = [n for n in ("st-torch", "st-onnx", "st-onnx-O3") if n in rate]
    fastest_st = max(st_fp32, key=lambda n: rate[n])
    ref = vectors["st-torch"]
    torch32 = vectors["lmembed-torch"]

    def cos(a: np.ndarray, b: np.ndarray) -> float:
        return float((a * b).sum(1).min())

    agreement = {
        "lmembed-torch": cos(torch32, ref),
        "lmembed-onnx": cos(vectors["lmembed-onnx"], ref),
        "lmembed-int8": cos(vectors["lmembed-int8"], torch32),
    }
    if "st-onnx-int8" in vectors:
        agreement["st-onnx-int8"] = cos(vectors["st-onnx-int8"], ref)
    return {
        "texts": len(texts),
        "tokens": tokens,
        "batch_size": bs,
        "repeats": args.repeats,
        "seconds": seconds,
        "median_seconds": median,
        "texts_per_s": rate,
        "fastest_st_float32": fastest_st,
        "ratios": {
            "lmembed-onnx / fastest st float32": rate["lmembed-onnx"] / rate[fastest_st],
            "lmembed-torch / fastest st float32": rate["lmembed-torch"] / rate[fastest_st],
            "lmembed-int8 / st-torch": rate["lmembed-int8"] / rate["st-torch"],
            **(
                {"lmembed-int8 / st-onnx-int8": rate["lmembed-int8"] / rate["st-onnx-int8"]}
                if "st-onnx-int8" in rate
                else {}
            ),
        },
        "min_cosine": agreement,
        "min_cosine_reference": "lmembed float32 and st-onnx-int8 vs st-torch; lmembed-int8 vs lmembed-torch",
        "int8_quality_gate": int8.backend.describe().get("quality_gate"),
        "st_onnx_rows": bool(args.st_onnx_python),
    }


def _features(embedder, texts: list[str], max_length: int = 256):
    from lmembed.encoding.inputs import InputBuilder

    cfg = embedder.config
    builder = InputBuilder(
        embedder.backbone.tokenizer, cfg, is_decoder=embedder.backbone.is_decoder, max_length=max_length
    )
    return builder.build_all(texts)


def decoder_section(args: argparse.Namespace) -> dict:
    from lmembed import Embedder
    from lmembed.evaluation.main_job import MAIN_JOB_DECODER_MAX_LENGTH, main_job_plan

    texts = load_texts(2 * args.decoder_texts)[args.decoder_texts // 2 :][: args.decoder_texts]
    strategies = next(s for m, s, _ in main_job_plan() if m == "smollm2-135m")
    kwargs = {"cache": False, "show_progress": False, "max_length": MAIN_JOB_DECODER_MAX_LENGTH, **strategies[0]}
    embedders = {
        "torch": Embedder.from_pretrained("smollm2-135m", **kwargs),
        "onnx": Embedder.from_pretrained("smollm2-135m", backend="onnx", **kwargs),
        "int8": Embedder.from_pretrained("smollm2-135m", precision="int8", **kwargs),
    }
    embedders["int8"].calibrate(load_texts(2000)[3::7][:256])
    for emb in embedders.values():
        emb.engine.pipelined = args.engine == "pipelined"
    configs = [embedders["torch"].config.with_options(**options) for options in strategies]
    bs = args.batch_size

    def run(emb):
        return lambda: timed(lambda: np.concatenate(emb.encode_strategies(texts, configs, batch_size=bs), axis=1))

    for name, emb in embedders.items():
        start = time.perf_counter()
        emb.encode_strategies(texts[:16], configs, batch_size=bs)
        print(f"warm-up smollm2 {name}: {time.perf_counter() - start:.1f}s", flush=True)
    seconds, vectors = interleave({name: run(emb) for name, emb in embedders.items()}, args.repeats)
    median = {name: float(np.median(s)) for name, s in seconds.items()}
    dim = embedders["torch"].backbone.hidden_size
    cos = {}
    for name in ("onnx", "int8"):
        per = [
            float(
                (vectors[name][:, i * dim : (i + 1) * dim] * vectors["torch"][:, i * dim : (i + 1) * dim]).sum(1).min()
            )
            for i in range(len(configs))
        ]
        cos[name] = dict(zip([c.label() for c in configs], per, strict=True))
    return {
        "texts": len(texts),
        "strategies": [c.label() for c in configs],
        "seconds": seconds,
        "median_seconds": median,
        "texts_per_s": {n: len(texts) / s for n, s in median.items()},
        "ratios_vs_torch_float32": {n: median["torch"] / s for n, s in median.items()},
        "min_cosine_vs_torch": cos,
        "int8_quality_gate": embedders["int8"].backend.describe().get("quality_gate"),
    }


def table(result: dict) -> str:
    lines = []
    m = result.get("minilm")
    if m:
        lines += [
            f"minilm, {m['texts']} texts ({m['tokens']} tokens), batch {m['batch_size']}, "
            f"median of {m['repeats']} interleaved rounds",
            "",
            "| contender | texts/s | vs st-torch | min cosine |",
            "|---|---|---|---|",
        ]
        for name, rate in m["texts_per_s"].items():
            c = m["min_cosine"].get(name)
            cell = "" if c is None else f"{c:.6f}"
            lines.append(f"| {name} | {rate:.1f} | {rate / m['texts_per_s']['st-torch']:.2f}x | {cell} |")
        lines += ["", *(f"- {k}: {v:.2f}x" for k, v in m["ratios"].items())]
        if not m["st_onnx_rows"]:
            lines.append("- sentence-transformers ONNX rows not measured (no --st-onnx-python)")
    d = result.get("decoder")
    if d:
        lines += [
            "",
            f"smollm2-135m, {d['texts']} texts, strategies {', '.join(d['strategies'])} (one forward pass)",
            "",
            "| backend | texts/s | vs torch float32 | min cosine vs torch (per strategy) |",
            "|---|---|---|---|",
        ]
        for name, rate in d["texts_per_s"].items():
            cos = d["min_cosine_vs_torch"].get(name, {})
            cells = ", ".join(f"{v:.4f}" for v in cos.values())
            lines.append(f"| {name} | {rate:.2f} | {d['ratios_vs_torch_float32'][name]:.2f}x | {cells} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--st-onnx-python", default=None, help="a Python with sentence-transformers[onnx]")
    parser.add_argument("--decoder-texts", type=int, default=0, help="also time smollm2-135m on this many texts")
    parser.add_argument("--skip-minilm", action="store_true")
    parser.add_argument("--tag", default="", help="suffix of the result files (result-TAG.json, table-TAG.md)")
    parser.add_argument(
        "--engine", choices=("serial", "pipelined"), default="pipelined", help="lmembed's encoding engine path"
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.n, args.batch_size)
        return
    import torch

    from lmembed.atomic import atomic_write_json, atomic_write_text

    result: dict = {"cpu_threads": torch.get_num_threads(), "load_average_at_start": os.getloadavg()}
    result["engine"] = args.engine  # EncodingEngine.pipelined of every lmembed contender
    OUT.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.tag}" if args.tag else ""

    def save() -> None:  # after each section, so a later failure keeps what was measured
        result["load_average_at_end"] = os.getloadavg()
        atomic_write_json(OUT / f"result{suffix}.json", result)
        atomic_write_text(OUT / f"table{suffix}.md", table(result))

    if not args.skip_minilm:
        result["minilm"] = minilm_section(args)
        save()
    if args.decoder_texts:
        result["decoder"] = decoder_section(args)
        save()
    print(table(result))
    print(f"saved {OUT / f'result{suffix}.json'}")


if __name__ == "__main__":
    main()
