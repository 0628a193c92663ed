"""GPU encoding throughput (issue 40): lmembed vs sentence-transformers in float16 and bfloat16, one run.

For each model, batch size (``--batch-sizes``, 32 and 128) and text length (``--lengths``; short: STSBenchmark
sentences, ~10 words; long: SciFact abstracts of at least 200 words cut at 300; on request, documents: five whole
abstracts joined, ~7,000 characters, read up to the max length), every contender encodes the same texts (mean
pooling, normalised vectors, at most ``--max-length`` tokens), in interleaved rounds (every contender once per
round after one warm-up; ``--repeats`` rounds at least, more while a contender has measured under ``--cell-seconds``
in the cell, up to ``--max-repeats``: a small model's calls are 0.1 s, and three of them moved by +-0.15x between
runs); each figure is the median over the rounds:

* ``st-float16`` / ``st-bfloat16``, the baselines: ``SentenceTransformer`` over the same folder with
  ``torch_dtype`` float16 / bfloat16 (its default SDPA);
* ``lmembed-<dtype>``: ``Embedder.from_pretrained(folder, dtype=...)`` with the pipelined engine
  (``EncodingEngine.pipelined = True``), ``lmembed-<dtype>-serial`` the same Embedder with it off;
* ``lmembed-<dtype>-window`` (the first dtype only): the pipelined engine planning a quarter of the cell's texts
  at a time (``EncodingEngine.plan_window``), so its first batches compute while the rest is tokenised;
* ``lmembed-<dtype>-graphs``: the pipelined engine on the ``cuda-graphs`` backend
  (:mod:`lmembed.encoding.backends.cuda_graphs`: each batch widened to a bucketed shape, its forward pass captured
  once as a CUDA graph and replayed; the graphs are captured in the warm-up and first round, which the ``first
  round`` rows show); on the dry run's CPU the widened batches run eagerly;
* ``lmembed-<dtype>-packed``: :func:`lmembed.encoding.packed.encode_packed` on that Embedder's engine (each batch
  packed in one row, no padding; torch's varlen flash kernel on CUDA), where the model allows it.

``--arms`` picks lmembed's rows (all by default; ``bench/gpu_checks.sh`` runs ``pipelined,graphs``).

Ratios are lmembed / st-float16 and lmembed / st-bfloat16 in the same cell. Vectors, in each cell: min cosine of
lmembed's to sentence-transformers' of the same dtype, pipelined vs serial (bit-for-bit or the largest difference),
packed and graphs vs serial (min cosine). Host, in each cell: the share of each lmembed call spent tokenising before
its first batch could run (``EncodingEngine.last_run``): what overlapping tokenisation with compute could win at most.
Models: ``minilm`` (its real weights), ``smollm2-135m`` (its architecture with
random weights, made by ``bench/gpu_random_smollm2.py``) and ``qwen2-0.5b`` (Qwen2-0.5B's configuration, written
below, with random weights built on the device; SmolLM2's byte-level BPE tokenizer stands in for Qwen2's, which is
not carried: throughput depends on token counts, not on which ids they are).

A time budget (``--budget-s``) stops the run cleanly between rounds; what was measured is written after every cell.
``--dry`` runs every cell with tiny random models of the same families and a few synthetic texts (CPU, seconds):
the test that keeps this script working (tests/test_bench_gpu.py).

    python bench/gpu_throughput.py                                    # on a GPU (bench/gpu_checks.sh)
    python bench/gpu_throughput.py --device cpu --dry --out /tmp/dry  # the dry run

Results: ``bench/results/gpu-throughput/result.json`` and ``table.md`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import functools
import gc
import inspect
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from _common import REPO, read_jsonl, shared_or_exit

OUT = REPO / "bench" / "results" / "gpu-throughput"
MODELS = ("minilm", "smollm2-135m", "qwen2-0.5b")
DTYPES = ("float16", "bfloat16")
LENGTHS = ("short", "long", "documents")
#: lmembed's arms (--arms): the default engine (pipelined), its serial reference, windows, CUDA graphs, packing.
ARMS = ("pipelined", "serial", "window", "graphs", "packed")
DEFAULT_LENGTHS = ("short", "long")  # --lengths: documents (five whole abstracts a text) on request
#: Qwen2-0.5B's configuration (its config.json on the Hub), built with random weights on the device.
QWEN2_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
#: The share of the texts a model's cells encode (the 0.5B model computes ~3x smollm2's per token; a cell keeps
#: its texts the same for every contender, so its ratios are unaffected).
TEXT_SHARE = {"qwen2-0.5b": 0.5}
#: --dry: 2-layer, 32-wide models of each family (the same code path, seconds on a CPU).
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
DRY_WORDS = "the study of protein cells shows that gene models predict a result in language and vector search"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
#: L's switch (issue 40): ``EncodingEngine.pipelined``, True by default. One place to adjust if it is renamed.
ENGINE_SWITCH = "pipelined"


# ---------------------------------------------------------------------------------------------------- the engine
def set_pipelined(embedder: Any, on: bool) -> bool:
    """Turn ``embedder``'s pipelined engine on or off; False when the engine has no such switch."""
    if not hasattr(embedder.engine, ENGINE_SWITCH):
        return False
    setattr(embedder.engine, ENGINE_SWITCH, on)
    return True


# ---------------------------------------------------------------------------------------------------- texts
def real_texts(n_short: int, n_long: int) -> dict[str, list[str]]:
    """Short: STSBenchmark test sentences (both sides); long: SciFact abstracts of 200+ words, cut at 300 words;
    documents: five of those abstracts whole, joined (~7,000 characters: far over ``--max-length``; half as many)."""
    sts = read_jsonl(shared_or_exit("sts/stsbenchmark/test.jsonl"))
    short = [r[side] for side in ("sentence1", "sentence2") for r in sts][:n_short]
    docs = read_jsonl(shared_or_exit("beir/scifact/corpus.jsonl"))
    words = [(d.get("title", "") + " " + d["text"]).split() for d in docs]
    whole = [w for w in words if len(w) >= 200]
    long = [" ".join(w[:300]) for w in whole][:n_long]
    documents = [" ".join(" ".join(w) for w in whole[i : i + 5]) for i in range(0, len(whole), 5)][: n_long // 2]
    return {"short": short, "long": long, "documents": documents}


def synthetic_texts(n_short: int, n_long: int) -> dict[str, list[str]]:
    """--dry: texts of varied length from a fixed word list (no data needed)."""
    vocab = DRY_WORDS.split()

    def text(i: int, words: int) -> str:
        return " ".join(vocab[(i * 7 + k * 3) % len(vocab)] for k in range(words))

    long = [text(i, 40 + (i * 13) % 80) for i in range(n_long)]
    return {
        "short": [text(i, 6 + i % 12) for i in range(n_short)],
        "long": long,
        "documents": [" ".join(long[i : i + 5] * 3) for i in range(0, len(long), 2)],
    }


# ---------------------------------------------------------------------------------------------------- models
def _tokenizer_source(name: str) -> Path:
    """Where a tokenizer is read from: minilm's own; SmolLM2's for both decoders (carried in .gpu/smollm2)."""
    from lmembed.models.bundled import resolve_bundled

    if name == "minilm":
        return Path(resolve_bundled("minilm"))
    carried = REPO / ".gpu" / "smollm2"
    if (carried / "tokenizer.json").exists():
        return carried
    return Path(resolve_bundled("smollm2-135m"))


def _copy_tokenizer(source: Path, folder: Path) -> None:
    for f in TOKENIZER_FILES:
        if (source / f).exists():
            shutil.copy(source / f, folder / f)


def build_random(name: str, folder: Path, *, tiny: bool, device: str) -> Path:
    """A model of ``name``'s family with random weights (seed 0) saved in ``folder`` with its tokenizer."""
    import torch
    import transformers as tf

    source = _tokenizer_source(name)
    tokenizer = tf.AutoTokenizer.from_pretrained(source)
    ids = {"pad_token_id": tokenizer.pad_token_id or tokenizer.eos_token_id}
    if name == "minilm":
        config = tf.BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **TINY)
        arch = tf.BertModel
    elif name == "smollm2-135m":  # tiny only: the full one is bench/gpu_random_smollm2.py's
        config = tf.LlamaConfig(
            vocab_size=len(tokenizer), num_key_value_heads=2, tie_word_embeddings=True, **TINY, **ids
        )
        arch = tf.LlamaForCausalLM
    else:
        sizes = {**QWEN2_05B, "vocab_size": len(tokenizer), **TINY, "num_key_value_heads": 2} if tiny else QWEN2_05B
        eos = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
        config = tf.Qwen2Config(**sizes, **ids, **eos)
        arch = tf.Qwen2ForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        model = arch(config)
    if not tiny:
        model = model.half()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    _copy_tokenizer(source, folder)
    del model
    return folder


def model_folder(name: str, args: argparse.Namespace, work: Path) -> tuple[Path, str, str]:
    """The folder sentence-transformers loads for ``name``, what lmembed loads (the bundled name, or that folder)
    and what its weights are."""
    from lmembed.models.bundled import resolve_bundled

    if args.dry:
        folder = build_random(name, work / name, tiny=True, device="cpu")
        return folder, str(folder), "random (tiny, --dry)"
    if name == "qwen2-0.5b":
        folder = build_random(name, work / name, tiny=False, device=args.device)
        return folder, str(folder), "random (Qwen2-0.5B config)"
    weights = "real" if name == "minilm" else "random (bench/gpu_random_smollm2.py)"
    return Path(resolve_bundled(name)), name, weights


def sentence_transformer(path: str, device: str, dtype: Any, max_length: int) -> Any:
    """sentence-transformers on ``path`` with mean pooling over the plain text's tokens (its defaults for a chat
    decoder are the last token of the chat-templated text)."""
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Pooling, Transformer

    options: dict[str, Any] = {"model_kwargs": {"torch_dtype": dtype}, "max_seq_length": max_length}
    if "modality_config" in inspect.signature(Transformer).parameters:
        # sentence-transformers >= 6 wraps a chat model's input in its chat template (a system prompt and all):
        # plain text in, as lmembed reads it, so both encode the same tokens
        options["modality_config"] = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}
        options["module_output_name"] = "token_embeddings"
    word = Transformer(path, **options)
    if word.tokenizer.pad_token is None:  # decoders ship without one; sentence-transformers pads on the right
        word.tokenizer.pad_token = word.tokenizer.eos_token
    width = (
        word.get_embedding_dimension()
        if hasattr(word, "get_embedding_dimension")
        else word.get_word_embedding_dimension()
    )
    return SentenceTransformer(modules=[word, Pooling(width, pooling_mode="mean")], device=device)


# ---------------------------------------------------------------------------------------------------- one model
def _normalised(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    return float((_normalised(a) * _normalised(b)).sum(1).min())


def contenders(
    name: str, folder: Path, source: str, args: argparse.Namespace
) -> tuple[dict[str, Callable], dict[str, Any]]:
    """Every contender for ``name`` as ``run(texts, batch_size) -> vectors``, and notes (what is missing, why)."""
    import torch

    from lmembed import Embedder
    from lmembed.encoding.packed import encode_packed

    runs: dict[str, Callable[[list[str], int], np.ndarray]] = {}
    notes: dict[str, Any] = {}
    for dtype in args.dtypes:
        st = sentence_transformer(str(folder), args.device, getattr(torch, dtype), args.max_length)

        def st_run(texts: list[str], bs: int, st: Any = st) -> np.ndarray:
            out = st.encode(texts, batch_size=bs, normalize_embeddings=True, convert_to_tensor=True)
            return out.float().cpu().numpy()

        runs[f"st-{dtype}"] = st_run
    for dtype in args.dtypes:
        emb = Embedder.from_pretrained(
            source,
            dtype=dtype,
            device=args.device,
            cache=False,
            show_progress=False,
            max_length=args.max_length,
            pooling="mean",
            **({"attention": "causal"} if name != "minilm" else {}),
        )
        label = f"lmembed-{dtype}"
        arms = args.arms
        if set_pipelined(emb, True):

            def lm_run(texts: list[str], bs: int, emb: Any = emb, on: bool = True) -> np.ndarray:
                set_pipelined(emb, on)
                return emb.encode(texts, batch_size=bs)

            lm_run.engine = emb.engine  # type: ignore[attr-defined]  # measure_cell reads its last_run

            if "pipelined" in arms:
                runs[label] = lm_run
            if "serial" in arms:
                serial = functools.partial(lm_run, on=False)
                serial.engine = emb.engine  # type: ignore[attr-defined]
                runs[f"{label}-serial"] = serial
            if "window" in arms and dtype == args.dtypes[0]:  # one dtype: every arm shares the cell's time budget
                # four windows a cell
                runs[f"{label}-window"] = engine_variant(emb, lm_run, "plan_window", lambda t, bs: max(bs, len(t) // 4))
            graphs = graph_backend(emb, args) if "graphs" in arms else None
            if graphs is not None:
                runs[f"{label}-graphs"] = engine_variant(emb, lm_run, "backend", lambda t, bs, g=graphs: g)
                runs[f"{label}-graphs"].graphs = graphs  # type: ignore[attr-defined]  # measure_cell counts them
            elif "graphs" in arms:
                notes["graphs"] = "this lmembed has no cuda-graphs backend"
        else:
            notes["engine_switch"] = f"EncodingEngine has no {ENGINE_SWITCH!r}: one engine, labelled -serial"
            runs[f"{label}-serial"] = lambda texts, bs, emb=emb: emb.encode(texts, batch_size=bs)
        if "packed" in arms:

            def packed_run(texts: list[str], bs: int, emb: Any = emb) -> np.ndarray:
                return _normalised(encode_packed(emb.engine, texts, emb.config, batch_size=bs))

            runs[f"{label}-packed"] = packed_run
    return runs, notes


def graph_backend(emb: Any, args: argparse.Namespace) -> Any:
    """The cuda-graphs backend over ``emb``'s model (its graphs captured in the cell's first calls); on the dry run's
    CPU, the same widened batches run eagerly. None where lmembed has no such backend (an older commit)."""
    try:
        from lmembed.encoding.backends.cuda_graphs import CudaGraphBackend
    except ImportError:
        return None
    return CudaGraphBackend(emb.engine.backbone, capture=args.device != "cpu")


def engine_variant(emb: Any, lm_run: Callable, setting: str, value: Callable[[list[str], int], Any]) -> Callable:
    """``lm_run`` with ``emb.engine.<setting>`` set to ``value(texts, batch_size)`` for each call, restored after.
    Built by a call, so each arm keeps its own Embedder (closures defined in the loop over dtypes found the last
    one's, before stop 48)."""

    def run(texts: list[str], bs: int) -> np.ndarray:
        before = getattr(emb.engine, setting)
        setattr(emb.engine, setting, value(texts, bs))
        try:
            return lm_run(texts, bs)
        finally:
            setattr(emb.engine, setting, before)

    run.engine = emb.engine  # type: ignore[attr-defined]  # measure_cell reads its last_run
    return run


def measure_cell(runs: dict[str, Callable], texts: list[str], bs: int, args: argparse.Namespace, clock) -> dict:
    """One cell: a warm-up of each contender, then interleaved rounds while the budget lasts."""
    import torch

    seconds: dict[str, list[float]] = {label: [] for label in runs}
    tokenising: dict[str, list[float]] = {label: [] for label in runs if hasattr(runs[label], "engine")}
    vectors: dict[str, np.ndarray] = {}
    errors: dict[str, str] = {}
    for label, run in runs.items():
        try:
            run(texts[: 2 * bs], bs)
        except Exception as exc:  # a contender that cannot run here (a kernel the device lacks): said, not fatal
            errors[label] = f"{type(exc).__name__}: {exc}"[:400]
            print(f"  {label} failed: {errors[label]}", flush=True)
    live = {label: run for label, run in runs.items() if label not in errors}
    for round_ in range(args.max_repeats):
        if round_ and clock() > args.budget_s:
            print(f"  time budget: {round_} rounds", flush=True)
            break
        # past --repeats, more rounds while the quickest contender has measured under --cell-seconds in all: short
        # calls (a small model's cell is 0.1 s) get more rounds, so their medians move less between runs
        if round_ >= args.repeats and min(sum(s) for s in seconds.values() if s) >= args.cell_seconds:
            break
        for label, run in live.items():
            if args.device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            vectors[label] = run(texts, bs)
            seconds[label].append(time.perf_counter() - start)
            if label in tokenising and run.engine.last_run is not None:  # type: ignore[attr-defined]
                tokenising[label].append(run.engine.last_run.tokenise_seconds)  # type: ignore[attr-defined]
        print(f"  round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in seconds.items() if v), flush=True)
    rate = {label: len(texts) / float(np.median(s)) for label, s in seconds.items() if s}
    # the first round meets every batch shape of the cell for the first time (the warm-up saw two batches): what a
    # call over new texts pays, as a corpus encoded once does
    first = {label: len(texts) / s[0] for label, s in seconds.items() if s}
    ratios = _ratios(rate, args.dtypes)
    # the host's tokenising, before the first batch can run (batches are planned from every length): the share of
    # the call during which the device waits for it, whichever path runs
    host = {
        f"tokenising share {label}": float(np.median(t)) / float(np.median(seconds[label]))
        for label, t in tokenising.items()
        if t and seconds[label]
    }
    agreement: dict[str, Any] = {}
    for d in args.dtypes:
        st, ours = f"st-{d}", f"lmembed-{d}"
        for label in (ours, f"{ours}-serial", f"{ours}-packed", f"{ours}-graphs"):
            if label in vectors and st in vectors:
                agreement[f"min_cos {label} vs {st}"] = _min_cos(vectors[label], vectors[st])
        serial = vectors.get(f"{ours}-serial")
        if serial is not None and f"{ours}-window" in vectors:  # other batches: equal within float rounding
            agreement[f"min_cos {ours}-window vs serial"] = _min_cos(vectors[f"{ours}-window"], serial)
        reference = serial if serial is not None else vectors.get(ours)
        if reference is not None and f"{ours}-graphs" in vectors:  # wider batches: equal within float rounding
            against = "serial" if serial is not None else "pipelined"
            agreement[f"min_cos {ours}-graphs vs {against}"] = _min_cos(vectors[f"{ours}-graphs"], reference)
        if serial is not None and ours in vectors:
            agreement[f"{ours} vs serial: bit-for-bit"] = bool(np.array_equal(vectors[ours], serial))
            agreement[f"{ours} vs serial: max abs diff"] = float(np.abs(vectors[ours] - serial).max())
        if serial is not None and f"{ours}-packed" in vectors:
            agreement[f"min_cos {ours}-packed vs serial"] = _min_cos(vectors[f"{ours}-packed"], serial)
    return {
        "texts": len(texts),
        "batch_size": bs,
        "rounds": min((len(s) for s in seconds.values() if s), default=0),
        "seconds": seconds,
        "texts_per_s": rate,
        "ratios": ratios,
        "first_round_ratios": _ratios(first, args.dtypes),
        "agreement": agreement,
        "host": host,
        "errors": errors,
        # the cuda-graphs arms: graphs held after the cell (captured in it or before) and passes run eagerly
        "graphs": {
            label: {"held": len(run.graphs.graphs), "eager_passes": run.graphs.eager_passes}
            for label, run in runs.items()
            if hasattr(run, "graphs")
        },
    }


def _ratios(rates: dict[str, float], dtypes: tuple[str, ...]) -> dict[str, float]:
    """Each lmembed arm's texts/s over each sentence-transformers baseline's, keyed ``"<arm> / st-<dtype>"``."""
    return {
        f"{label} / {base}": rates[label] / rates[base]
        for base in (f"st-{d}" for d in dtypes)
        if base in rates
        for label in rates
        if label.startswith("lmembed-")
    }


def model_section(
    name: str, texts: dict[str, list[str]], args: argparse.Namespace, work: Path, clock, save, section: dict
) -> None:
    """Fills ``section`` (already in the result, so that each save has the cells measured so far)."""
    import torch
    from transformers import AutoTokenizer

    folder, source, weights = model_folder(name, args, work)
    runs, notes = contenders(name, folder, source, args)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    section.update({"weights": weights, "folder": str(folder), "notes": notes, "cells": {}})
    share = TEXT_SHARE.get(name, 1.0)
    texts = {k: v[: max(1, int(len(v) * share))] for k, v in texts.items()}
    section["tokenizer"] = "SmolLM2's (byte-level BPE, 49,152 tokens)" if name != "minilm" else "minilm's (WordPiece)"
    for length in args.lengths:
        counts = [len(ids) for ids in tokenizer(texts[length], truncation=True, max_length=args.max_length).input_ids]
        section[f"mean_tokens_{length}"] = float(np.mean(counts))
    section["lengths"] = list(args.lengths)
    for bs in args.batch_sizes:
        for length in args.lengths:
            cell = f"batch {bs}, {length}"
            if clock() > args.budget_s:
                section["cells"][cell] = {"skipped": f"time budget ({args.budget_s:.0f} s) spent"}
                continue
            print(f"{name}: {cell} ({len(texts[length])} texts)", flush=True)
            section["cells"][cell] = measure_cell(runs, texts[length], bs, args, clock)
            save()
    del runs
    gc.collect()
    if args.device != "cpu":
        torch.cuda.empty_cache()
    if name == "qwen2-0.5b" and not args.dry:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- the table
def table(result: dict) -> str:
    head = f"# Encoding throughput on {result['device_name']}: lmembed vs sentence-transformers (baselines), one run"
    lines = [
        head,
        "",
        f"{result['date']}; torch {result['versions']['torch']}, transformers {result['versions']['transformers']}, "
        f"sentence-transformers {result['versions']['sentence_transformers']}; max {result['max_length']} tokens, "
        f"mean pooling, normalised; median of {result['repeats']} to {result.get('max_repeats', result['repeats'])} "
        f"interleaved rounds after a warm-up (more where calls are short, to {result.get('cell_seconds', 0)} s a "
        "contender); "
        f"{result['elapsed_s']:.0f} s of a {result['budget_s']:.0f} s budget.",
    ]
    if result.get("dry"):
        lines += ["", "**Dry run** (tiny random models, synthetic texts): checks the script, measures nothing."]
    if result.get("stopped"):
        lines += ["", f"Stopped early: {result['stopped']}"]
    for name, m in result["models"].items():
        if "lengths" not in m:  # a section still loading its models
            continue
        cells = list(m["cells"])
        done = [c for c in cells if "texts_per_s" in m["cells"][c]]
        lines += [
            "",
            f"## {name}: {m['weights']} weights, tokenizer {m['tokenizer']}",
            "",
            "Mean tokens per text (as read, at most the max length): "
            + ", ".join(f"{length} {m[f'mean_tokens_{length}']:.1f}" for length in m["lengths"])
            + ". "
            + "; ".join(f"{k}: {v}" for k, v in m["notes"].items()),
            "",
        ]
        for c in cells:
            if "skipped" in m["cells"][c]:
                lines.append(f"- {c}: skipped ({m['cells'][c]['skipped']})")
            for label, err in m["cells"][c].get("errors", {}).items():
                lines.append(f"- {c}: {label} failed: {err}")
        if not done:
            continue
        labels = list(dict.fromkeys(k for c in done for k in m["cells"][c]["texts_per_s"]))
        lines += ["", "| texts/s | " + " | ".join(done) + " |", "|---|" + "---:|" * len(done)]
        for label in labels:
            row = [m["cells"][c]["texts_per_s"].get(label) for c in done]
            lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.0f}" for v in row) + " |")
        for base in (f"st-{d}" for d in result["dtypes"]):
            lines += ["", f"| / {base} | " + " | ".join(done) + " |", "|---|" + "---:|" * len(done)]
            for label in (x for x in labels if x.startswith("lmembed-")):
                row = [m["cells"][c]["ratios"].get(f"{label} / {base}") for c in done]
                lines.append(f"| {label} | " + " | ".join("-" if v is None else f"**{v:.2f}x**" for v in row) + " |")
        base = f"st-{result['dtypes'][0]}"
        if any("first_round_ratios" in m["cells"][c] for c in done):
            head = f"| first round / {base} (new shapes) | "
            lines += ["", head + " | ".join(done) + " |", "|---|" + "---:|" * len(done)]
            for label in (x for x in labels if x.startswith("lmembed-")):
                row = [m["cells"][c].get("first_round_ratios", {}).get(f"{label} / {base}") for c in done]
                lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.2f}x" for v in row) + " |")
        shares = list(dict.fromkeys(k for c in done for k in m["cells"][c].get("host", {})))
        if shares:
            lines += ["", "| host | " + " | ".join(done) + " |", "|---|" + "---:|" * len(done)]
            for share in shares:
                row = [m["cells"][c].get("host", {}).get(share) for c in done]
                lines.append(f"| {share} | " + " | ".join("-" if v is None else f"{v:.0%}" for v in row) + " |")
        held = list(dict.fromkeys(k for c in done for k in m["cells"][c].get("graphs", {})))
        if held:
            head = "| cuda graphs: held / eager passes | "
            lines += ["", head + " | ".join(done) + " |", "|---|" + "---:|" * len(done)]
            for label in held:
                row = [m["cells"][c].get("graphs", {}).get(label) for c in done]
                cells_ = ["-" if v is None else f"{v['held']} / {v['eager_passes']}" for v in row]
                lines.append(f"| {label} | " + " | ".join(cells_) + " |")
        checks = list(dict.fromkeys(k for c in done for k in m["cells"][c]["agreement"]))
        lines += ["", "| vectors | " + " | ".join(done) + " |", "|---|" + "---:|" * len(done)]
        for check in checks:
            row = [m["cells"][c]["agreement"].get(check) for c in done]
            lines.append(f"| {check} | " + " | ".join(_fmt(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    return f"{value:.5f}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


# ---------------------------------------------------------------------------------------------------- main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dry", action="store_true", help="tiny random models and synthetic texts: checks the script")
    parser.add_argument("--out", type=Path, default=None, help=f"where result.json and table.md go (default {OUT})")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--batch-sizes", default="128,32")
    parser.add_argument("--n-short", type=int, default=2048)
    parser.add_argument("--n-long", type=int, default=512)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="rounds in every cell (at least)")
    parser.add_argument(
        "--max-repeats", type=int, default=None, help="rounds at most, while --cell-seconds is not met (15; --dry: 1)"
    )
    parser.add_argument(
        "--cell-seconds",
        type=float,
        default=1.0,
        help="more rounds (up to --max-repeats) until each contender has measured this long in the cell",
    )
    parser.add_argument("--budget-s", type=float, default=330.0, help="stop between rounds after this many seconds")
    parser.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"comma list of lmembed's arms, of {', '.join(ARMS)} (pipelined: the default engine, lmembed-<dtype>)",
    )
    parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma list of {', '.join(DTYPES)}")
    parser.add_argument(
        "--lengths", default=",".join(DEFAULT_LENGTHS), help=f"comma list of {', '.join(LENGTHS)} (the texts' cells)"
    )
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if unknown := [m for m in args.models if m not in MODELS]:
        parser.error(f"--models: choose among {', '.join(MODELS)}; got {', '.join(unknown)}")
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--batch-sizes: a comma list of integers, got {args.batch_sizes!r}")
    for option in ("n_short", "n_long", "max_length", "repeats"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')}: must be at least 1, got {getattr(args, option)}")
    if args.device == "cpu" and not args.dry:
        parser.error("--device cpu measures nothing about a GPU: use it with --dry (the script's own check)")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error("--batch-sizes: each must be at least 1")
    if args.dry:
        args.n_short, args.n_long, args.repeats = min(args.n_short, 12), min(args.n_long, 6), 1
        args.batch_sizes = [min(b, 4 * (i + 1)) for i, b in enumerate(args.batch_sizes)]
    args.lengths = _choices(parser, "--lengths", args.lengths, LENGTHS)
    if args.max_repeats is None:
        args.max_repeats = 1 if args.dry else 15
    args.max_repeats = max(args.max_repeats, args.repeats)
    args.dtypes = _choices(parser, "--dtypes", args.dtypes, DTYPES)
    args.arms = _choices(parser, "--arms", args.arms, ARMS)
    return args


def _choices(parser: argparse.ArgumentParser, option: str, value: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A comma list of at least one of ``allowed``; anything else ends the run with ``option`` named."""
    chosen = tuple(x.strip() for x in value.split(",") if x.strip())
    if not chosen or (unknown := [x for x in chosen if x not in allowed]):
        parser.error(f"{option}: choose among {', '.join(allowed)}; got {', '.join(unknown) if chosen else 'none'}")
    return chosen


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    started = time.monotonic()

    def clock() -> float:
        return time.monotonic() - started

    import sentence_transformers
    import torch
    import transformers

    if args.device != "cpu" and not torch.cuda.is_available():
        sys.exit(f"skipped: --device {args.device} but torch sees no CUDA device (run where a GPU is lent)")
    if args.dry:  # tiny models gain nothing from threads, and on a busy machine two threads stall on every matmul
        torch.set_num_threads(1)
    out = args.out or OUT
    out.mkdir(parents=True, exist_ok=True)
    work = Path(f"/tmp/lmembed-gpu-throughput-{time.time_ns()}")
    texts = synthetic_texts(args.n_short, args.n_long) if args.dry else real_texts(args.n_short, args.n_long)
    result: dict[str, Any] = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device != "cpu" else "CPU (dry run)",
        "dry": args.dry,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "sentence_transformers": sentence_transformers.__version__,
        },
        "max_length": args.max_length,
        "repeats": args.repeats,
        "max_repeats": args.max_repeats,
        "cell_seconds": args.cell_seconds,
        "dtypes": list(args.dtypes),
        "budget_s": args.budget_s,
        "texts": {k: len(v) for k, v in texts.items()},
        "mean_words": {k: float(np.mean([len(t.split()) for t in v])) for k, v in texts.items()},
        "models": {},
    }

    def save() -> None:
        result["elapsed_s"] = clock()
        (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        (out / "table.md").write_text(table(result))

    try:
        for name in args.models:
            if clock() > args.budget_s:
                result["stopped"] = f"time budget spent before {name}"
                break
            section = result["models"][name] = {}
            model_section(name, texts, args, work, clock, save, section)
            save()
    finally:
        result["models"] = {k: v for k, v in result["models"].items() if "weights" in v}
        save()
        shutil.rmtree(work, ignore_errors=True)
    print(table(result))
    return result


if __name__ == "__main__":
    main()
