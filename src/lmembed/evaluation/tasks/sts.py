"""Semantic textual similarity, scored as MTEB's ``AbsTaskSTS`` scores it.

Both sentences of each pair are embedded; the pair's predicted similarity is the cosine of the two
embeddings (also the negative Manhattan and Euclidean distances, and the dot product). Each
prediction list is correlated with the gold scores; ``cosine_spearman`` is the main score.

Gold scores: MTEB rescales them to [0, 1] with ``(score - min_score) / (max_score - min_score)``
(0–5 for every English STS set, SICK-R included although SICK's scale is 1–5). Pearson and Spearman
correlations do not change under such a linear map, so the rescaling affects nothing; we apply it
anyway so that any stored per-pair data matches MTEB's.

Keys (MTEB 2.x): ``cosine_pearson``, ``cosine_spearman``, ``manhattan_*``, ``euclidean_*``, and
``pearson``/``spearman`` for "the model's own similarity", which for lmembed encoders is the
cosine. MTEB reports no dot-product variant for STS; we add ``dot_pearson``/``dot_spearman`` as
extra keys (they equal the cosine ones for L2-normalised embeddings).

The items (for paired comparisons) are the pairs: each pair's cosine, with the gold scores as the
reference of a Spearman correlation.

Data: jsonl rows ``{"sentence1", "sentence2", "score"}`` (extra fields are ignored).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics.pairwise import (
    paired_cosine_distances,
    paired_euclidean_distances,
    paired_manhattan_distances,
)

from lmembed.encoding.inputs import validate_texts
from lmembed.errors import ConfigError, InputError
from lmembed.evaluation.base import ItemScores
from lmembed.evaluation.tasks._common import (
    TaskBase,
    finite_number,
    paired_cosine,
    read_numbered_jsonl,
    require_fields,
    require_same_length,
    text_value,
)
from lmembed.protocols import RetrievalEncoder


def _correlations(gold: np.ndarray, predicted: np.ndarray) -> tuple[float, float]:
    """(Pearson, Spearman) between gold and predicted scores."""
    return float(pearsonr(gold, predicted)[0]), float(spearmanr(gold, predicted)[0])


def check_gold_scores(scores: Any, argument: str = "scores", *, correlatable: bool = True) -> list[float]:
    """Gold scores as floats: a list of finite numbers, else an :class:`InputError` naming ``argument``. With
    ``correlatable``, also at least 2 of them, not all equal (a correlation with fewer, or with a constant, is
    undefined: scipy would raise, or give NaN)."""
    if scores is None or isinstance(scores, str | bytes | Mapping | set | frozenset):
        raise InputError(f"{argument} must be a list of numbers, got {type(scores).__name__}")
    try:
        values = list(scores)
    except TypeError:
        raise InputError(f"{argument} must be a list of numbers, got {type(scores).__name__}") from None
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise InputError(f"{argument}[{i}] is {type(value).__name__} ({value!r:.40}); every score must be a number")
        if not math.isfinite(value):
            raise InputError(f"{argument}[{i}] is {value}; every score must be a finite number")
    if correlatable and len(values) < 2:
        raise InputError(f"{argument} holds {len(values)} score(s); a correlation needs at least 2 pairs")
    if correlatable and len(set(values)) == 1:
        raise InputError(f"{argument} are all {values[0]}; a correlation with constant gold scores is undefined")
    return [float(v) for v in values]


def sts_scores(
    embeddings1: np.ndarray,
    embeddings2: np.ndarray,
    gold_scores: Sequence[float],
    *,
    min_score: float = 0.0,
    max_score: float = 5.0,
) -> dict[str, float]:
    """MTEB's STS metrics for paired embeddings (row i of each matrix is pair i)."""
    if len(embeddings1) != len(embeddings2) or len(embeddings1) != len(gold_scores):
        raise ValueError("embeddings1, embeddings2 and gold_scores must have the same length")
    _check_scale(min_score, max_score)
    gold = (np.asarray(check_gold_scores(gold_scores, "gold_scores")) - min_score) / (max_score - min_score)
    predictions = {
        "cosine": 1.0 - paired_cosine_distances(embeddings1, embeddings2),
        "manhattan": -paired_manhattan_distances(embeddings1, embeddings2),
        "euclidean": -paired_euclidean_distances(embeddings1, embeddings2),
        "dot": np.einsum("ij,ij->i", embeddings1, embeddings2),
    }
    scores: dict[str, float] = {}
    for name, predicted in predictions.items():
        pearson, spearman = _correlations(gold, np.asarray(predicted, dtype=np.float64))
        scores[f"{name}_pearson"] = pearson
        scores[f"{name}_spearman"] = spearman
    scores["pearson"] = scores["cosine_pearson"]
    scores["spearman"] = scores["cosine_spearman"]
    scores["main_score"] = scores["cosine_spearman"]
    return scores


def _check_scale(min_score: Any, max_score: Any) -> None:
    for name, value in (("min_score", min_score), ("max_score", max_score)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{name}={value!r:.40} must be a finite number")
    if max_score <= min_score:
        raise ConfigError(f"max_score={max_score} must be more than min_score={min_score}")


def load_sts_pairs(path: str | Path) -> tuple[list[str], list[str], list[float]]:
    """Read ``{"sentence1", "sentence2", "score"}`` rows into three parallel lists; a row without a sentence or
    a finite numeric score (``NaN`` is none) is a :class:`TaskDataError` naming file and line."""
    first: list[str] = []
    second: list[str] = []
    scores: list[float] = []
    for line_no, row in read_numbered_jsonl(path):
        require_fields(row, ("sentence1", "sentence2", "score"), path, line_no)
        first.append(text_value(row["sentence1"], "field 'sentence1'", path, line_no))
        second.append(text_value(row["sentence2"], "field 'sentence2'", path, line_no))
        scores.append(finite_number(row["score"], "field 'score'", path, line_no))
    return first, second, scores


@dataclass
class STSTask(TaskBase):
    """One STS dataset: sentence pairs with gold similarity scores.

    ``instruction`` (optional) is a task description; following E5-mistral and NV-Embed it is
    applied to *both* sentences, since STS is symmetric.
    """

    name: str
    sentence1: list[str]
    sentence2: list[str]
    scores: list[float]
    split: str = "test"
    min_score: float = 0.0
    max_score: float = 5.0
    instruction: str | None = None
    subset: str = "default"
    task_type: ClassVar[str] = "STS"
    main_metric: ClassVar[str] = "cosine_spearman"
    item_fields: ClassVar[tuple[str, ...]] = ("scores", "sentence1", "sentence2")

    def __post_init__(self) -> None:
        self.sentence1 = validate_texts(self.sentence1, "sentence1")
        self.sentence2 = validate_texts(self.sentence2, "sentence2")
        require_same_length(self.name, sentence1=self.sentence1, sentence2=self.sentence2, scores=self.scores)
        self.scores = check_gold_scores(self.scores, "scores", correlatable=False)  # a 1-pair task loads; not scored
        _check_scale(self.min_score, self.max_score)

    def texts(self) -> list[str]:
        """Both sides of every pair: the first sentences, then the second ones."""
        return [*self.sentence1, *self.sentence2]

    @classmethod
    def _read(cls, file: Path) -> tuple[list[str], list[str], list[float]]:
        return load_sts_pairs(file)

    def _scores(
        self, encoder: RetrievalEncoder, batch_size: int
    ) -> tuple[dict[str, float], dict[str, Any], ItemScores]:
        """Embed both sides (each distinct sentence once) and score the pairs."""
        check_gold_scores(self.scores, "scores")  # before anything is embedded
        embeddings1, embeddings2 = self._embed_pairs(encoder, self.sentence1, self.sentence2, batch_size)
        scores = sts_scores(embeddings1, embeddings2, self.scores, min_score=self.min_score, max_score=self.max_score)
        items = ItemScores.numbered("spearman", paired_cosine(embeddings1, embeddings2), self.scores)
        return scores, {"num_pairs": len(self.sentence1)}, items
