"""Summarization (SummEval), following MTEB's ``AbsTaskSummarization``.

For each source text, every machine summary is scored by its highest cosine similarity (and,
separately, highest dot product) to any of that text's human summaries. Those predicted scores are
correlated with the human relevance scores *within the text* (Spearman and Pearson); the task score
is the mean over texts. ``cosine_spearman`` is the main score. A text is skipped when its human
scores, or either list of predicted scores, are all equal (a correlation is undefined there).
Relevance scores are rescaled with ``(x - min_score) / (max_score - min_score)`` as MTEB does,
which does not change any correlation.

The items (for paired comparisons) are the source texts: each one's Spearman correlation of its best
cosines against its relevance scores, for the texts where that correlation is defined.

``legacy_pvalue_bug=True`` reproduces MTEB's original ``SummEval`` numbers: that evaluator averaged
the (statistic, p-value) pairs scipy returns, so its reported "spearman" is
``(mean statistic + mean p-value) / 2`` (mteb issue #1156; mteb 2.x keeps it as
``DeprecatedSummarizationEvaluator`` for ``SummEval`` and fixes it in ``SummEvalSummarization.v2``).

Data: jsonl rows ``{"text", "human_summaries": [...], "machine_summaries": [...], "relevance": [...]}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy.stats import pearsonr, spearmanr

from lmembed.evaluation.base import ItemScores
from lmembed.evaluation.tasks._common import (
    TaskBase,
    TaskDataError,
    finite_number,
    read_numbered_jsonl,
    require_fields,
    row_error,
)
from lmembed.pooling.normalize import unit_rows
from lmembed.protocols import RetrievalEncoder


@dataclass
class SummarizationSample:
    """One source text with its human summaries and scored machine summaries."""

    text: str
    human_summaries: list[str]
    machine_summaries: list[str]
    relevance: list[float]


def predicted_scores(human: np.ndarray, machine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per machine summary: best cosine and best dot product against the human summaries."""
    cosine = (unit_rows(machine, dtype=None) @ unit_rows(human, dtype=None).T).max(axis=1)
    dot = (machine @ human.T).max(axis=1)
    return cosine.astype(np.float64), dot.astype(np.float64)


def _correlation(kind: str, gold: list[float], predicted: np.ndarray, legacy: bool) -> float:
    """Spearman or Pearson; with ``legacy`` the mean of (statistic, p-value) as old MTEB did."""
    result = spearmanr(gold, predicted) if kind == "spearman" else pearsonr(gold, predicted)
    statistic, p_value = float(result[0]), float(result[1])
    return (statistic + p_value) / 2 if legacy else statistic


def summarization_scores(
    per_text: list[tuple[list[float], np.ndarray, np.ndarray]], *, legacy_pvalue_bug: bool = False
) -> dict[str, float]:
    """Mean within-text correlations from (gold, cosine predictions, dot predictions) triples."""
    kept = [
        (gold, cos, dot)
        for gold, cos, dot in per_text
        if len(set(gold)) > 1 and len(set(cos.tolist())) > 1 and len(set(dot.tolist())) > 1
    ]
    if not kept:
        raise TaskDataError("no text has varying human and predicted scores; correlations are undefined")
    scores: dict[str, float] = {}
    for name, column in (("cosine", 1), ("dot", 2)):
        for kind in ("spearman", "pearson"):
            values = [_correlation(kind, row[0], row[column], legacy_pvalue_bug) for row in kept]
            scores[f"{name}_{kind}"] = float(np.mean(values))
    scores["spearman"] = scores["cosine_spearman"]
    scores["pearson"] = scores["cosine_pearson"]
    scores["main_score"] = scores["cosine_spearman"]
    return scores


def _add_item(items: ItemScores, item_id: str, relevance: list[float], cosine: np.ndarray) -> None:
    """Add a text's Spearman of its best cosines against its relevance, unless one side is constant."""
    if len(set(relevance)) > 1 and len(set(cosine.tolist())) > 1:
        items.ids.append(item_id)
        items.values.append(float(spearmanr(relevance, cosine)[0]))


def load_summarization(path: str | Path) -> list[SummarizationSample]:
    """Read SummEval-format rows; a problem (a field that is not a list, a relevance score that is not a finite
    number) is a :class:`TaskDataError` naming file and line."""
    rows = read_numbered_jsonl(path)
    require_fields(rows[0][1], ("text", "human_summaries", "machine_summaries", "relevance"), path, rows[0][0])
    samples = []
    for line_no, row in rows:
        human, machine, relevance = row.get("human_summaries"), row.get("machine_summaries"), row.get("relevance")
        if not all(isinstance(v, list) for v in (human, machine, relevance)):
            raise row_error(path, line_no, "summaries and relevance must be lists")
        if len(machine) != len(relevance) or not human:
            raise row_error(path, line_no, "one relevance score per machine summary, >=1 human summary")
        samples.append(
            SummarizationSample(
                str(row.get("text", "")),
                [str(s) for s in human],
                [str(s) for s in machine],
                [finite_number(x, "a relevance score", path, line_no) for x in relevance],
            )
        )
    return samples


@dataclass
class SummarizationTask(TaskBase):
    """One summarization dataset; ``instruction`` (optional) goes on all summaries."""

    name: str
    samples: list[SummarizationSample]
    split: str = "test"
    min_score: float = 0.0
    max_score: float = 5.0
    legacy_pvalue_bug: bool = False
    instruction: str | None = None
    subset: str = "default"
    task_type: ClassVar[str] = "Summarization"
    main_metric: ClassVar[str] = "cosine_spearman"
    item_fields: ClassVar[tuple[str, ...]] = ("samples",)

    @classmethod
    def _read(cls, file: Path) -> tuple[list[SummarizationSample]]:
        return (load_summarization(file),)

    def texts(self) -> list[str]:
        """Every source text's human summaries, then its machine summaries."""
        return [t for s in self.samples for t in (*s.human_summaries, *s.machine_summaries)]

    def _scores(
        self, encoder: RetrievalEncoder, batch_size: int
    ) -> tuple[dict[str, float], dict[str, Any], ItemScores]:
        """Embed all summaries (each distinct one once) and average the per-text correlations."""
        embeddings = self._embed(encoder, self.texts(), batch_size)
        span = self.max_score - self.min_score
        per_text, start = [], 0
        items = ItemScores("mean", [], [])
        for number, sample in enumerate(self.samples):
            n_human, n_machine = len(sample.human_summaries), len(sample.machine_summaries)
            human = embeddings[start : start + n_human]
            machine = embeddings[start + n_human : start + n_human + n_machine]
            start += n_human + n_machine
            gold = [(x - self.min_score) / span for x in sample.relevance]
            per_text.append((gold, *predicted_scores(human, machine)))
            _add_item(items, str(number), sample.relevance, per_text[-1][1])
        scores = summarization_scores(per_text, legacy_pvalue_bug=self.legacy_pvalue_bug)
        return scores, {"num_texts": len(self.samples), "legacy_pvalue_bug": self.legacy_pvalue_bug}, items
