"""Pair classification (duplicate / paraphrase detection), following MTEB's ``AbsTaskPairClassification``.

Each pair gets a score from its two embeddings under five scoring functions: the model's own
similarity (cosine for lmembed encoders), cosine, dot product, and the Manhattan and Euclidean
distances (where *lower* means "more alike"). For each function MTEB reports

* ``ap``: average precision of the scores against the 0/1 labels (distances negated);
* ``accuracy``: the best accuracy over thresholds placed between consecutive sorted scores;
* ``f1`` (with its ``precision`` and ``recall``): the best F1 over the same thresholds;

and, for each metric, the maximum over the functions (``max_ap``, ``max_f1`` ...). The main score
is ``max_ap``. The items (for paired comparisons) are the pairs: each pair's cosine, judged by average
precision against its label. Key names follow mteb 2.x: ``cosine_ap``, ``dot_f1``, ``manhattan_accuracy``,
``similarity_ap`` ... A threshold is never placed between two equal scores (mteb 2.x's tie rule;
mteb 1.x would split ties by row order, which only matters when scores tie exactly).

Data, either layout (jsonl):

* MTEB's: one row holding lists ``{"sentence1": [...], "sentence2": [...], "labels": [...]}``
  (several such rows are concatenated);
* one pair per row: ``{"sentence1": str, "sentence2": str, "label": 0|1}`` (``labels`` also accepted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from sklearn.metrics import average_precision_score
from sklearn.metrics.pairwise import (
    paired_cosine_distances,
    paired_euclidean_distances,
    paired_manhattan_distances,
)

from lmembed.encoding.inputs import validate_texts
from lmembed.evaluation.base import ItemScores
from lmembed.evaluation.tasks._common import (
    TaskBase,
    paired_cosine,
    read_numbered_jsonl,
    require_fields,
    require_same_length,
    row_error,
    text_value,
)
from lmembed.protocols import RetrievalEncoder

_MAX_KEYS = ("accuracy", "f1", "precision", "recall", "ap")


def best_accuracy(scores: Sequence[float], labels: Sequence[int], higher_is_closer: bool) -> tuple[float, float]:
    """Best accuracy over thresholds between distinct consecutive sorted scores, and that threshold."""
    rows = sorted(zip(scores, labels, strict=True), key=lambda row: row[0], reverse=higher_is_closer)
    positives_above, negatives_below = 0, sum(1 for label in labels if label == 0)
    best, threshold = 0.0, -1.0
    for i in range(len(rows) - 1):
        score, label = rows[i]
        if label == 1:
            positives_above += 1
        else:
            negatives_below -= 1
        if score == rows[i + 1][0]:
            continue
        accuracy = (positives_above + negatives_below) / len(labels)
        if accuracy > best:
            best, threshold = accuracy, (score + rows[i + 1][0]) / 2
    return best, threshold


def best_f1(
    scores: Sequence[float], labels: Sequence[int], higher_is_closer: bool
) -> tuple[float, float, float, float]:
    """Best F1 over the same thresholds: (f1, precision, recall, threshold)."""
    rows = sorted(zip(scores, labels, strict=True), key=lambda row: row[0], reverse=higher_is_closer)
    total_positives = sum(labels)
    best = (0.0, 0.0, 0.0, 0.0)
    hits = 0
    for i in range(len(rows) - 1):
        score, label = rows[i]
        hits += label == 1
        if score == rows[i + 1][0] or hits == 0:
            continue
        precision, recall = hits / (i + 1), hits / total_positives
        f1 = 2 * precision * recall / (precision + recall)
        if f1 > best[0]:
            best = (f1, precision, recall, (score + rows[i + 1][0]) / 2)
    return best


def threshold_metrics(scores: Sequence[float], labels: Sequence[int], higher_is_closer: bool) -> dict[str, float]:
    """accuracy, f1, precision, recall and ap for one scoring function."""
    accuracy, _ = best_accuracy(scores, labels, higher_is_closer)
    f1, precision, recall, _ = best_f1(scores, labels, higher_is_closer)
    sign = 1.0 if higher_is_closer else -1.0
    ap = average_precision_score(labels, sign * np.asarray(scores, dtype=np.float64))
    return {
        "accuracy": float(accuracy),
        "f1": float(f1),
        "precision": float(precision),
        "recall": float(recall),
        "ap": float(ap),
    }


def pair_scores(embeddings1: np.ndarray, embeddings2: np.ndarray) -> dict[str, tuple[np.ndarray, bool]]:
    """Per-pair scores of every scoring function, with whether higher means "more alike"."""
    cosine = 1.0 - paired_cosine_distances(embeddings1, embeddings2)
    return {
        "similarity": (cosine, True),
        "cosine": (cosine, True),
        "manhattan": (paired_manhattan_distances(embeddings1, embeddings2), False),
        "euclidean": (paired_euclidean_distances(embeddings1, embeddings2), False),
        "dot": (np.einsum("ij,ij->i", embeddings1, embeddings2), True),
    }


def pair_classification_scores(
    embeddings1: np.ndarray, embeddings2: np.ndarray, labels: Sequence[int]
) -> dict[str, float]:
    """All of MTEB's pair-classification metrics, plus ``main_score`` (= ``max_ap``)."""
    labels = [int(label) for label in labels]
    per_function = {
        function: threshold_metrics(values.tolist(), labels, higher_is_closer)
        for function, (values, higher_is_closer) in pair_scores(embeddings1, embeddings2).items()
    }
    output = {
        f"{function}_{metric}": value for function, metrics in per_function.items() for metric, value in metrics.items()
    }
    for metric in _MAX_KEYS:
        output[f"max_{metric}"] = max(metrics[metric] for metrics in per_function.values())
    output["main_score"] = output["max_ap"]
    return output


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def load_pairs(path: str | Path) -> tuple[list[str], list[str], list[int]]:
    """Read pairs in either layout (see the module docstring); a row of another shape, a sentence that is not a
    string or a label that is not 0 or 1 (``NaN``, ``null``, 0.5, ``"yes"``) is a :class:`TaskDataError` naming
    file and line."""
    rows = read_numbered_jsonl(path)
    label_key = "labels" if "labels" in rows[0][1] else "label"
    first, second, labels = [], [], []
    for line_no, row in rows:
        require_fields(row, ("sentence1", "sentence2", label_key), path, line_no)
        s1, s2, lab = (_as_list(row[k]) for k in ("sentence1", "sentence2", label_key))
        if not len(s1) == len(s2) == len(lab):
            raise row_error(path, line_no, "sentence1, sentence2 and the labels are lists of different lengths")
        first += [text_value(s, "a sentence", path, line_no) for s in s1]
        second += [text_value(s, "a sentence", path, line_no) for s in s2]
        labels += [_binary_label(x, label_key, path, line_no) for x in lab]
    return first, second, labels


def _binary_label(value: Any, key: str, path: str | Path, line_no: int) -> int:
    """A pair's label, 0 or 1 (``true``/``false`` and 0.0/1.0 read as such)."""
    if isinstance(value, bool | int | float) and value in (0, 1):
        return int(value)
    raise row_error(path, line_no, f"field {key!r}: labels must be 0 or 1, got {value!r:.40}")


@dataclass
class PairClassificationTask(TaskBase):
    """One pair-classification dataset; ``instruction`` (optional) goes on both sentences."""

    name: str
    sentence1: list[str]
    sentence2: list[str]
    labels: list[int]
    split: str = "test"
    instruction: str | None = None
    subset: str = "default"
    task_type: ClassVar[str] = "PairClassification"
    main_metric: ClassVar[str] = "max_ap"
    item_fields: ClassVar[tuple[str, ...]] = ("labels", "sentence1", "sentence2")

    def __post_init__(self) -> None:
        self.sentence1 = validate_texts(self.sentence1, "sentence1")
        self.sentence2 = validate_texts(self.sentence2, "sentence2")
        require_same_length(self.name, sentence1=self.sentence1, sentence2=self.sentence2, labels=self.labels)

    def texts(self) -> list[str]:
        """Both sides of every pair: the first sentences, then the second ones."""
        return [*self.sentence1, *self.sentence2]

    @classmethod
    def _read(cls, file: Path) -> tuple[list[str], list[str], list[int]]:
        return load_pairs(file)

    def _scores(
        self, encoder: RetrievalEncoder, batch_size: int
    ) -> tuple[dict[str, float], dict[str, Any], ItemScores]:
        """Embed both sides (each distinct sentence once) and compute the threshold metrics."""
        embeddings1, embeddings2 = self._embed_pairs(encoder, self.sentence1, self.sentence2, batch_size)
        scores = pair_classification_scores(embeddings1, embeddings2, self.labels)
        items = ItemScores.numbered("ap", paired_cosine(embeddings1, embeddings2), self.labels)
        return scores, {"num_pairs": len(self.sentence1)}, items
