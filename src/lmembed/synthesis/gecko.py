"""Gecko's FRet recipe (Lee et al. 2024): per seed passage, the LLM writes a task and a query; an embedder
retrieves the top-k passages; the LLM relabels them by query likelihood (log p(query | passage)) and relevance
classification (p("yes" | query, passage)), the two rankings fused by reciprocal rank. The best passage becomes
the positive (it may differ from the seed), one from the lower fused ranks the hard negative.

The generation helpers here (one request per seed passage, reading its answer) serve the corpus-only recipe too.
An answer is a JSON object (``keys``) by default; a recipe with ``answer: plain-query`` asks for one plain-text
query instead (small generators cannot hold a JSON format) and reads it strictly with
:func:`~lmembed.synthesis.parsing.parse_query_line` (``query_words: [min, max]``, ``max_copied``,
``require_question``); its task
description, which the model is then not asked for, is the recipe's ``instruction``. ``max_passage_words`` cuts
the passage shown to the generator (retrieval and the rows keep it whole).

A generator that gives no prompt log-probabilities (most endpoints) relabels by relevance alone; the run's notes
and every row's provenance (``relabel``) say so. When every candidate scores the same (such an endpoint answering
every relevance question alike), the ranking falls back to the retriever's order: the notes say so, and the rows'
provenance has ``ranking: retriever-order``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from typing import Any

from lmembed.synthesis.generators import Request, ScoringUnsupported
from lmembed.synthesis.parsing import Parsed, parse_object, parse_query_line
from lmembed.synthesis.recipes import render
from lmembed.synthesis.retrieval import corpus_embeddings, top_k
from lmembed.synthesis.runner import Context, ShardResult

BOTH, RELEVANCE_ONLY = "query-likelihood+relevance", "relevance-only"
#: the relabelling when every candidate scored the same (an endpoint without log-probabilities whose relevance
#: answers are all equal): the fused ranking is then the retriever's, and the notes and provenance say so
RETRIEVER_ORDER = "retriever-order"


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(json.dumps(parts).encode()).digest()[:4], "big")


def passage_items(context: Context) -> list[dict[str, Any]]:
    return [{"id": pid, "index": i} for i, pid in enumerate(context.corpus_ids)]


PLAIN_QUERY = "plain-query"


def prompt_passage(context: Context, index: int) -> str:
    """The passage as the generator sees it: cut to the recipe's ``max_passage_words`` when it sets one."""
    text, limit = context.corpus_texts[index], context.recipe.get("max_passage_words")
    if limit is None:
        return text
    words = text.split()
    return text if len(words) <= int(limit) else " ".join(words[: int(limit)]) + " ..."


def read_answer(answer: str, item: dict[str, Any], context: Context) -> Parsed:
    """A generated answer read as the recipe asks: a JSON object with its ``keys``, or one plain-text query."""
    recipe = context.recipe
    if recipe.get("answer", "json") != PLAIN_QUERY:
        return parse_object(answer, tuple(recipe.data["keys"]), plain_text=bool(recipe.get("plain_text")))
    low, high = recipe.get("query_words", [3, 32])
    parsed = parse_query_line(
        answer,
        context.corpus_texts[item["index"]],
        min_words=int(low),
        max_words=int(high),
        max_copied=float(recipe.get("max_copied", 0.8)),
        question=bool(recipe.get("require_question", False)),
    )
    if parsed.ok and recipe.get("instruction"):
        return Parsed(value={**parsed.value, "task": str(recipe.get("instruction"))}, repaired=parsed.repaired)
    return parsed


def generation_requests(items: Sequence[dict[str, Any]], context: Context) -> list[Request]:
    recipe = context.recipe
    return [
        Request(
            (
                {
                    "role": "user",
                    "content": render(recipe.data["generate"], passage=prompt_passage(context, i["index"])),
                },
            ),
            json_keys=tuple(recipe.get("keys") or ()) if recipe.get("answer", "json") != PLAIN_QUERY else (),
            max_new_tokens=int(recipe.get("max_new_tokens", 128)),
            temperature=float(recipe.get("temperature", 0.0)),
            seed=_seed(context.seed, i["id"]),
        )
        for i in items
    ]


def rrf(*rankings: Sequence[float], k: int = 60) -> list[float]:
    """Reciprocal-rank fusion of score lists over the same candidates (higher score, better rank)."""
    fused = [0.0] * len(rankings[0])
    for scores in rankings:
        order = sorted(range(len(scores)), key=lambda j: -scores[j])
        for rank, j in enumerate(order, 1):
            fused[j] += 1.0 / (k + rank)
    return fused


def negative_pool(
    ranked: list[int], candidates: list[int], texts: list[str], seed: int, ranks: tuple[int, int]
) -> list[int]:
    """The candidates (positions in ``candidates``, best first in ``ranked``) a hard negative is drawn from: those at
    fused ranks ``ranks`` (1-based, inclusive; else any below the positive), never the seed passage (the query was
    written from it) nor a passage whose text is the positive's (a duplicate)."""
    low, high = ranks
    positive = texts[ranked[0]]

    def allowed(j: int) -> bool:
        return candidates[j] != seed and texts[j] != positive

    return [j for j in ranked[max(1, low - 1) : high] if allowed(j)] or [j for j in ranked[1:] if allowed(j)]


class GeckoRunner:
    """Generate, retrieve, relabel, fuse."""

    def plan(self, context: Context) -> list[dict[str, Any]]:
        corpus_embeddings(context)  # embedded once, here, not by each worker
        return passage_items(context)

    def _query_likelihood(self, context: Context, query: str, candidates: list[int]) -> list[float] | None:
        template = context.recipe.data["query_likelihood"]
        contexts = [render(template, passage=prompt_passage(context, c)) for c in candidates]
        try:
            return context.generator.loglikelihood(contexts, [query] * len(candidates))
        except ScoringUnsupported as exc:
            note = f"relabel: {RELEVANCE_ONLY} ({exc})"
            if note not in context.notes:
                context.notes.append(note)
            return None

    def run(self, items: Sequence[dict[str, Any]], context: Context) -> ShardResult:
        recipe = context.recipe
        result = ShardResult(attempted=len(items))
        answers = context.generator.generate(generation_requests(items, context))
        kept = []
        for item, answer in zip(items, answers, strict=True):
            parsed = read_answer(answer, item, context)
            if parsed.ok:
                result.repaired += parsed.repaired
                kept.append((item, parsed.value))
            else:
                result.reject(parsed.reason, answer)
        order, _ = top_k(context, [v["query"] for _, v in kept], int(recipe.get("top_k", 8)))
        for (item, value), retrieved in zip(kept, order, strict=True):
            row = self._relabel(item, value, [int(c) for c in retrieved], context)
            if isinstance(row, str):
                result.rejected[row] += 1
            else:
                result.rows.append(row)
        return result

    def _relabel(self, item: dict[str, Any], value: dict[str, str], candidates: list[int], context: Context) -> Any:
        recipe, query = context.recipe, value["query"]
        if item["index"] not in candidates:
            candidates.append(item["index"])  # the seed is always a candidate; it need not win
        if len(candidates) < 2:
            return "too_few_candidates"
        ql = self._query_likelihood(context, query, candidates)
        rc = context.generator.yes_probability(
            [render(recipe.data["relevance"], query=query, passage=prompt_passage(context, c)) for c in candidates]
        )
        fused = rrf(*([ql, rc] if ql is not None else [rc]), k=int(recipe.get("rrf_k", 60)))
        ranked = sorted(range(len(candidates)), key=lambda j: -fused[j])  # stable: ties keep the retriever's order
        relabel, ranking = (BOTH if ql is not None else RELEVANCE_ONLY), "fused"
        if ql is None and len(set(rc)) == 1:  # relevance alone, all equal: rrf ranks ties in the retriever's order
            ranking = RETRIEVER_ORDER
            note = (
                f"relabel: {RETRIEVER_ORDER} (every candidate of a query scored the same, so the positive and "
                "negative follow the retriever's ranking)"
            )
            if note not in context.notes:
                context.notes.append(note)
        low, high = recipe.get("negative_ranks", [3, 8])
        positive = ranked[0]
        texts = [context.corpus_texts[c] for c in candidates]
        pool = negative_pool(ranked, candidates, texts, item["index"], (low, high))
        if not pool:
            return "no_negative"
        negative = random.Random(_seed(context.seed, item["id"], "negative")).choice(pool)

        def scores(j: int) -> dict[str, Any]:
            return {
                "id": context.corpus_ids[candidates[j]],
                "query_likelihood": ql[j] if ql is not None else None,
                "relevance": rc[j],
                "fused": fused[j],
                "rank": ranked.index(j) + 1,
            }

        return {
            "query": query,
            "positive": context.corpus_texts[candidates[positive]],
            "negatives": [context.corpus_texts[candidates[negative]]],
            "instruction": value.get("task"),
            "task": "gecko",
            "provenance": context.provenance(
                prompt="generate",
                seed_passage=item["id"],
                positive_is_seed=candidates[positive] == item["index"],
                relabel=relabel,
                ranking=ranking,
                positive=scores(positive),
                negative=scores(negative),
            ),
        }
