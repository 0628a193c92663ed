"""Tokenising a text read as it is: one tokenizer pass where it fits, against the two passes before (issue 40).

``InputBuilder.build_all`` used to tokenise every text twice: alone (to find where to cut it) and then wrapped
(with its special tokens). For a text with nothing wrapped around it the second pass gives the first one's tokens,
so a text that fits is now tokenised once (``InputBuilder._build_bare``); a text over the budget is still cut and
tokenised again, and a text far over the budget is cut where a prefix of it shows (``_exact_prefixes``: the rest
is never tokenised). The baseline, in the same run, is the two-pass path (``InputBuilder._build_cut``), which still
serves wrapped texts; both give the same features (checked here, and in tests/encoding/test_inputs_one_pass.py).
A second table times the pooling mask of a whole text: every token's offsets against none (stop 60 pools every token
of a text read whole, as sentence-transformers does; before it, the leading tokens' offsets were read).

Texts: SciFact abstracts of at least 200 words cut at 300 (``bench/gpu_throughput.py``'s long texts) and
STSBenchmark test sentences (its short texts); tokenizers: minilm's (WordPiece) and SmolLM2's (byte-level BPE);
max length 512 (most long texts fit) and 256 (most are cut); and "documents" of 20 abstracts each. Best of
``--repeats`` timings.
Results: ``bench/results/encode-throughput/tokenise-passes.json`` and ``.md``.

    python bench/tokenise_passes.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from _common import REPO, markdown_table, write_report
from gpu_throughput import real_texts
from lmembed import Embedder
from lmembed.encoding.inputs import InputBuilder
from lmembed.models.bundled import resolve_bundled

OUT = REPO / "bench" / "results" / "encode-throughput"


def best(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def _every_offset_mask(enc: Any) -> list[int]:
    """The whole-text pooling mask as it was read before stop 48, every token's offsets converted: the baseline."""
    pairs = zip(enc.offsets, enc.special_tokens_mask, strict=True)
    return [1 if is_special else int(end > 0) for (_, end), is_special in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-short", type=int, default=2048)
    parser.add_argument("--n-long", type=int, default=1291)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    texts = real_texts(args.n_short, args.n_long)
    # documents as a user's long files hold them: 20 abstracts each (~30,000 characters), cut at max_length
    texts["documents"] = [" ".join(texts["long"][i : i + 20]) for i in range(0, len(texts["long"]), 20)]
    rows, masks, result = [], [], {"repeats": args.repeats, "texts": {k: len(v) for k, v in texts.items()}, "cells": []}
    for model in ("minilm", "smollm2-135m"):
        emb = Embedder.from_pretrained(str(resolve_bundled(model)), cache=False, show_progress=False)
        for max_length in (512, 256):
            builder = emb.engine.input_builder(emb.config, max_length=max_length)
            budget, limit = builder._budget(None)
            for length, batch in texts.items():
                two = builder._build_cut(batch, None, budget, limit, prefixes=False)
                one = builder.build_all(batch)
                same = [(a.input_ids, a.pool_mask) for a in one] == [(b.input_ids, b.pool_mask) for b in two]
                fit = sum(len(e) - builder.num_special <= budget for e in builder._encode(batch, special=True))
                cut = builder._build_cut
                baseline = best(
                    lambda c=cut, t=batch, b=budget, m=limit: c(t, None, b, m, prefixes=False), args.repeats
                )
                ours = best(lambda b=builder, t=batch: b.build_all(t), args.repeats)
                cell = {
                    "model": model,
                    "max_length": max_length,
                    "texts": length,
                    "fit": fit / len(batch),
                    "two_pass_s": baseline,
                    "one_pass_s": ours,
                    "ratio": ours / baseline,
                    "same_features": same,
                }
                result["cells"].append(cell)
                rows.append(
                    [model, max_length, f"{length} ({len(batch)})", f"{fit / len(batch):.0%}", f"{baseline:.3f}"]
                )
                rows[-1] += [f"{ours:.3f}", f"**{ours / baseline:.2f}x**", "yes" if same else "**no**"]
                print(rows[-1], flush=True)
            # the pooling mask of a whole text: the rule read on every token's offsets (as before stop 48) vs none
            # (InputBuilder._pool_mask since stop 60: every token of a text read whole is pooled)
            encodings = builder._encode(texts["long"], special=True)
            rule = best(lambda e=encodings: [_every_offset_mask(x) for x in e], args.repeats)
            lead = best(lambda e=encodings: [InputBuilder._pool_mask(x, 0) for x in e], args.repeats)
            result["cells"].append({"model": model, "max_length": max_length, "mask_rule_s": rule, "mask_lead_s": lead})
            masks.append([model, max_length, f"long ({len(encodings)})", f"{rule:.4f}", f"{lead:.4f}"])
            masks[-1].append(f"**{lead / rule:.2f}x**")
    header = ["tokenizer", "max length", "texts", "fit", "two passes s", "one pass s", "time / two passes", "equal"]
    lines = [
        "# Tokenising texts read as they are: one pass where they fit vs two (baseline, same run)",
        "",
        f"`python bench/tokenise_passes.py`; best of {args.repeats}; `fit`: the share of texts within the budget.",
        "",
        *markdown_table(header, rows),
        "",
        "The pooling mask of a text read whole, from its encoding: every token's offsets (the rule, baseline) against",
        "none (`InputBuilder._pool_mask` with nothing excluded, as `build_all` reads it since stop 60: every token).",
        "",
        *markdown_table(["tokenizer", "max length", "texts", "all offsets s", "no offsets s", "ratio"], masks),
    ]
    write_report(OUT, "tokenise-passes", result, lines)


if __name__ == "__main__":
    main()
