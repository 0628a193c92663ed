"""Cutting long texts on a prefix, checked at volume: features equal to tokenising every text whole.

``InputBuilder._exact_prefixes`` finds a long text's cut on a prefix of it, where the tokenizer's steps are
local. ``tests/encoding/test_inputs_one_pass.py`` checks it on 60 random long texts per tokenizer kind and length;
this runs the same comparison on many more, with harder pieces mixed in (combining accents, ligatures, zero-width
and control characters, runs of 100 spaces, 300-letter words), read as they are and with a sentence-transformers
prompt (truncated by the tokenizer), over the suite's seven tokenizer kinds and, with
``--gemma``, the bundled gemma3-270m's (SentencePiece BPE with byte fallback). It counts the texts compared, those
cut on a prefix and the mismatches (the figure that must be 0), and exits 1 on any mismatch.

    python bench/prefix_cut_stress.py [--seeds 6] [--texts 80] [--gemma]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any

from _common import REPO

sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "encoding")]
import test_inputs_one_pass as cases  # noqa: E402  (the suite's tokenizer kinds and random texts)
from lmembed.encoding.inputs import InputBuilder  # noqa: E402

HARD = [" " * 100, "\n" * 30, "a" * 300, "🙂" * 50, "x.y.z" * 20, "«»", "—", "\u0301", "e\u0301", "ﬁ", "Å", "ß", "İ"]
HARD += ["\u200b", "\x00", "\x07"]
LENGTHS = (8, 16, 33, 64, 128, 256, 512)


def texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for text in cases._random_texts(seed, n):
        parts = list(text)
        for _ in range(rng.randint(0, 30)):
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(HARD))
        out.append("".join(parts))
    return out


def compare(name: str, builder_for: Any, seeds: int, n: int) -> tuple[int, int, int]:
    checked = via_prefix = bad = 0
    for max_length in LENGTHS:
        builder = builder_for(max_length)
        budget, limit = builder._budget(None)
        for seed in range(seeds):
            batch = texts(seed * 1000 + max_length, n)
            via_prefix += len(builder._exact_prefixes(batch, budget))
            want = builder._build_cut(batch, None, budget, limit, prefixes=False)
            pairs = [("plain", want, builder.build_all(batch))]
            # sentence-transformers prompts: the prompted string truncated by the tokenizer, read whole or on a prefix
            prompted = InputBuilder(
                builder.tokenizer,
                builder.config.with_options(prompt_style="sentence_transformers", instruction_template="{instruction}"),
                is_decoder=builder.eos_id is not None,
                max_length=max_length,
            )
            got = prompted.build_all(batch, "query: ")
            kept = max_length - (1 if prompted.eos_id is not None else 0) - prompted.num_special  # as _build_prompted
            via_prefix += len(prompted._exact_prefixes(["query: " + t for t in batch], kept))
            prompted._exact_prefixes = lambda strings, budget: {}  # type: ignore[method-assign]  # read whole
            pairs.append(("prompted", prompted.build_all(batch, "query: "), got))
            for kind, expected, got in pairs:
                for text, w, g in zip(batch, expected, got, strict=True):
                    checked += 1
                    if (w.input_ids, w.pool_mask) != (g.input_ids, g.pool_mask):
                        bad += 1
                        print(f"MISMATCH {name} {kind} max_length={max_length}: {text[:120]!r}", flush=True)
    print(f"{name}: {checked} texts, {via_prefix} cut on a prefix, {bad} mismatches", flush=True)
    return checked, via_prefix, bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--texts", type=int, default=80)
    parser.add_argument("--gemma", action="store_true", help="also gemma3-270m's tokenizer (loads the model)")
    args = parser.parse_args()
    start = time.perf_counter()
    totals = [0, 0, 0]
    runs: dict[str, Any] = {kind: (lambda m, kind=kind: cases._builder(kind, m)) for kind in cases.KINDS}
    if args.gemma:
        from lmembed import Embedder

        emb = Embedder.from_pretrained("gemma3-270m", cache=False, show_progress=False)
        runs["gemma3-270m"] = lambda m: emb.engine.input_builder(emb.config, max_length=m)
    for name, builder_for in runs.items():
        for i, count in enumerate(compare(name, builder_for, args.seeds, args.texts)):
            totals[i] += count
    seconds = time.perf_counter() - start
    print(f"all: {totals[0]} texts, {totals[1]} cut on a prefix, {totals[2]} mismatches, {seconds:.0f} s")
    sys.exit(1 if totals[2] else 0)


if __name__ == "__main__":
    main()
