"""Why the main job reads SmolLM2's middle layer through the final norm: the size of its raw hidden states and how
alike mean-pooled raw vectors are, against the same layer read through the final norm (the baseline, same run).

On the main job's corpus (``SciFact[500 docs]``: every judged document plus distractors, 256 tokens, as
``lmembed eval`` with no arguments reads it), for each layer of ``--layers``:

* the largest |x| of any hidden state as transformers returns it (raw below the last layer; its last entry,
  layer L, is after the final norm), and the largest once each text's first token is left out (where a
  decoder's "massive activations" sit), with how many of the hidden dimensions hold values above 100;
* the mean pairwise cosine of the mean-pooled vectors, raw and through the final norm, and nDCG@10 of both on the
  task (lmembed's own evaluation, the embedding cache off).

    python bench/massive_activations.py                       # layers 15 and 30 (the last)
    python bench/massive_activations.py --layers 10 15 --docs 200

Results: ``bench/results/massive-activations/smollm2-135m.json`` and ``.md``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from _common import REPO, write_report

OUT = REPO / "bench" / "results" / "massive-activations"


def mean_pairwise_cosine(vectors: np.ndarray) -> float:
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    sims = unit @ unit.T
    n = len(unit)
    return float((sims.sum() - np.trace(sims)) / (n * (n - 1)))


def state_sizes(embedder, texts: list[str], layer: int, batch_size: int = 8) -> dict[str, float]:
    """The largest raw |x| at ``layer`` over ``texts`` (all tokens, and past each text's first), and the number of
    hidden dimensions that ever exceed 100 past the first token."""
    tok, model = embedder.backbone.tokenizer, embedder.backbone.model
    top_all = top_rest = 0.0
    big_dims: set[int] = set()
    for start in range(0, len(texts), batch_size):
        batch = tok(
            texts[start : start + batch_size], padding=True, truncation=True, max_length=256, return_tensors="pt"
        )
        with torch.inference_mode():
            states = model(**batch, output_hidden_states=True).hidden_states[layer].float()
        mask = batch["attention_mask"].bool()
        first = torch.zeros_like(mask)
        first[torch.arange(mask.shape[0]), mask.int().argmax(dim=1)] = True  # each text's first real token
        rest = mask & ~first
        top_all = max(top_all, float(states[mask].abs().max()))
        past = states[rest].abs()
        top_rest = max(top_rest, float(past.max()))
        big_dims |= set(torch.nonzero((past > 100).any(dim=0)).flatten().tolist())
    return {"max_abs": top_all, "max_abs_past_first_token": top_rest, "dims_over_100_past_first": len(big_dims)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[15, 30])
    parser.add_argument("--docs", type=int, default=500, help="documents of the main job's corpus measured")
    args = parser.parse_args()

    from lmembed import Embedder
    from lmembed.evaluation.main_job import main_job_tasks

    task = main_job_tasks()["subset"]
    texts = list(task.data.corpus_texts)[: args.docs]
    result: dict = {"model": "smollm2-135m", "task": task.name, "docs": len(texts), "layers": {}}
    lines = [
        f"# Massive activations: smollm2-135m on {task.name} ({len(texts)} docs for the sizes and cosines)",
        "",
        "`python bench/massive_activations.py` (baseline: the same layer through the final norm, same run)",
        "",
        "| layer | max abs x | max abs x past the first token | dims > 100 past it | mean pairwise cosine raw "
        "| through the norm | nDCG@10 raw | through the norm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for layer in args.layers:
        row: dict = {}
        for final_norm in (False, True):
            embedder = Embedder.from_pretrained(
                "smollm2-135m",
                pooling="mean",
                layer=layer,
                final_norm=final_norm,
                max_length=256,
                cache=False,
                show_progress=False,
            )
            key = "norm" if final_norm else "raw"
            unnormalised = embedder.with_config(embedder.config.with_options(normalize=False))
            row[f"cosine_{key}"] = mean_pairwise_cosine(unnormalised.encode(texts, batch_size=16))
            row[f"ndcg_at_10_{key}"] = float(task.evaluate(embedder, batch_size=16).scores["ndcg_at_10"])
            if not final_norm:
                row.update(state_sizes(embedder, texts, layer))
        result["layers"][str(layer)] = row
        lines.append(
            f"| {layer} | {row['max_abs']:,.0f} | {row['max_abs_past_first_token']:,.0f} | "
            f"{row['dims_over_100_past_first']} | {row['cosine_raw']:.4f} | {row['cosine_norm']:.4f} | "
            f"{100 * row['ndcg_at_10_raw']:.2f} | {100 * row['ndcg_at_10_norm']:.2f} |"
        )
    write_report(OUT, "smollm2-135m", result, lines)


if __name__ == "__main__":
    main()
