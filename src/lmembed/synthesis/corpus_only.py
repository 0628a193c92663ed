"""Corpus-only domain adaptation (Promptagator / GPL): queries generated from a user's own passages, kept only
when a teacher embedder finds the seed passage again in its top-k (round-trip consistency), with hard negatives
mined from the teacher's ranking (the top ranks skipped, as likely unlabelled positives) and the teacher's scores
kept for distillation (``teacher_scores``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from lmembed.synthesis.gecko import generation_requests, passage_items, read_answer
from lmembed.synthesis.retrieval import corpus_embeddings, top_k
from lmembed.synthesis.runner import Context, ShardResult


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _opens(query: str, passage: str) -> bool:
    """Whether ``query`` (case and punctuation aside) is the opening of ``passage``."""
    words = _words(query)
    return bool(words) and _words(passage)[: len(words)] == words


class CorpusOnlyRunner:
    """Generate a query per passage; keep it if the round trip holds; mine negatives."""

    def plan(self, context: Context) -> list[dict[str, Any]]:
        corpus_embeddings(context)  # embedded once, here, not by each worker
        return passage_items(context)

    def run(self, items: Sequence[dict[str, Any]], context: Context) -> ShardResult:
        recipe = context.recipe
        k = int(recipe.get("top_k", 10))
        first, count = int(recipe.get("negatives_from_rank", 3)), int(recipe.get("negatives", 4))
        result = ShardResult(attempted=len(items))
        kept = []
        for item, answer in zip(items, context.generator.generate(generation_requests(items, context)), strict=True):
            parsed = read_answer(answer, item, context)
            if parsed.ok and _opens(parsed.value["query"], context.corpus_texts[item["index"]]):
                result.reject("copy", answer)  # a query that is its passage's opening teaches nothing
            elif parsed.ok:
                result.repaired += parsed.repaired
                kept.append((item, parsed.value["query"]))
            else:
                result.reject(parsed.reason, answer)
        order, scores = top_k(context, [q for _, q in kept], max(k, first - 1 + count))
        for (item, query), ranked, ranked_scores in zip(kept, order, scores, strict=True):
            hits = [int(i) for i in ranked[:k]]
            if item["index"] not in hits:
                result.reject("round_trip", query)
                continue
            seed_score = float(ranked_scores[hits.index(item["index"])])
            below = zip(ranked[first - 1 :], ranked_scores[first - 1 :], strict=True)
            mined = [(int(i), float(s)) for i, s in below if int(i) != item["index"]][:count]
            if not mined:
                result.reject("no_negatives", query)
                continue
            result.rows.append(
                {
                    "query": query,
                    "positive": context.corpus_texts[item["index"]],
                    "negatives": [context.corpus_texts[i] for i, _ in mined],
                    "task": "corpus-only",
                    "teacher_scores": {"positive": seed_score, "negatives": [s for _, s in mined]},
                    "provenance": context.provenance(
                        prompt="generate",
                        seed_passage=item["id"],
                        seed_rank=hits.index(item["index"]) + 1,
                        negative_ids=[context.corpus_ids[i] for i, _ in mined],
                    ),
                }
            )
        return result
