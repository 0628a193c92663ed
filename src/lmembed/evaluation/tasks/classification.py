"""Classification with a logistic-regression probe, following MTEB's ``AbsTaskClassification``.

Protocol (the one that produced the published mteb 1.12.75 numbers, and that mteb 2.x keeps):

1. ``n_experiments`` (10) experiments. Before experiment *k*, the index order of the train split is
   shuffled by a ``numpy.random.RandomState(seed)`` freshly seeded with 42; the order shuffled is the
   one left by experiment *k-1* (``arange(n)`` before the first). Walking that order, the first
   ``samples_per_label`` examples of each label are kept (8 by default; EmotionClassification 16).
2. A ``LogisticRegression(max_iter=100)`` (lbfgs, default C) is fitted on the kept examples'
   embeddings and predicts the whole evaluation split.
3. Accuracy (main score), macro F1 and the other metrics are averaged over the experiments.

Why this is the 1.12.75 protocol: mteb 1.12.75 shuffled with the *global* ``np.random.shuffle``, but
every evaluator it built (one per experiment) re-seeded the global generator with 42 in
``Evaluator.__init__``, and the task constructor did the same before the first experiment. So each
shuffle started from a fresh seed-42 state and permuted the previous order: exactly what mteb 2.x's
``_undersample_data`` does explicitly with ``RandomState(seed)`` ("for backward compatibility with
v1"). The classifier is deterministic (lbfgs ignores ``random_state``), so the result depends only on
the embeddings. Only the train examples some experiment uses are embedded. The task reports no per-item
values (a test row's correctness depends on the probe of each experiment).

Data: ``train.jsonl`` and ``<split>.jsonl`` with rows ``{"text", "label"}`` (``label_text`` optional).
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from sklearn.exceptions import ConvergenceWarning, UndefinedMetricWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    precision_score,
    recall_score,
)

from lmembed.evaluation.tasks._common import (
    DEFAULT_SEED,
    TaskBase,
    TaskDataError,
    read_numbered_jsonl,
    require_fields,
    row_error,
    split_file,
    text_value,
)
from lmembed.protocols import RetrievalEncoder


def undersample(
    labels: Sequence[Hashable],
    *,
    samples_per_label: int = 8,
    n_experiments: int = 10,
    seed: int = DEFAULT_SEED,
) -> list[list[int]]:
    """The train indices each experiment uses, in MTEB's order (see the module docstring)."""
    order = np.arange(len(labels))
    selections: list[list[int]] = []
    for _ in range(n_experiments):
        np.random.RandomState(seed).shuffle(order)
        taken: dict[Hashable, int] = defaultdict(int)
        chosen: list[int] = []
        for index in order:
            label = labels[int(index)]
            if taken[label] < samples_per_label:
                chosen.append(int(index))
                taken[label] += 1
        selections.append(chosen)
    return selections


def classification_metrics(y_true: Sequence[Any], y_pred: Sequence[Any]) -> dict[str, float]:
    """MTEB's per-experiment metrics; ``ap``/``ap_weighted`` only for two-class test sets."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        scores = {
            "accuracy": accuracy_score(y_true, y_pred),
            "f1": f1_score(y_true, y_pred, average="macro"),
            "f1_weighted": f1_score(y_true, y_pred, average="weighted"),
            "precision": precision_score(y_true, y_pred, average="macro"),
            "precision_weighted": precision_score(y_true, y_pred, average="weighted"),
            "recall": recall_score(y_true, y_pred, average="macro"),
            "recall_weighted": recall_score(y_true, y_pred, average="weighted"),
        }
        if len(np.unique(np.asarray(y_true))) == 2:
            # MTEB scores AP on the hard predictions, not on probabilities; kept for parity.
            scores["ap"] = average_precision_score(y_true, y_pred, average="macro")
            scores["ap_weighted"] = average_precision_score(y_true, y_pred, average="weighted")
    return {key: float(value) for key, value in scores.items()}


def fit_and_predict(
    train_x: np.ndarray, train_y: Sequence[Any], test_x: np.ndarray, *, max_iter: int = 100, seed: int = 42
) -> np.ndarray:
    """Fit MTEB's probe (``LogisticRegression(max_iter=100)``) and predict the test rows."""
    probe = LogisticRegression(max_iter=max_iter, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        probe.fit(train_x, np.asarray(train_y))
    return probe.predict(test_x)


def _mean_scores(per_experiment: list[dict[str, float]]) -> dict[str, float]:
    """Average every metric over the experiments."""
    return {key: float(np.mean([s[key] for s in per_experiment])) for key in per_experiment[0]}


def _used(selections: list[list[int]]) -> list[int]:
    """The train indices any experiment uses, sorted."""
    return sorted(set().union(*selections))


def load_labelled_texts(path: str | Path) -> tuple[list[str], list[Any]]:
    """Read ``{"text", "label"}`` rows into texts and labels. A label is a string, an integer or a boolean (a
    class's name); a row without a text or with another label (``null``, ``NaN``, 1.5, a list) is a
    :class:`TaskDataError` naming file and line."""
    texts: list[str] = []
    labels: list[Any] = []
    for line_no, row in read_numbered_jsonl(path):
        require_fields(row, ("text", "label"), path, line_no)
        texts.append(text_value(row["text"], "field 'text'", path, line_no))
        labels.append(_label(row["label"], path, line_no))
    return texts, labels


def _label(value: Any, path: str | Path, line_no: int) -> Any:
    """A class label as given: a string, an integer or a boolean; a float only when it is a whole number (1.0, as
    ``1``); anything else cannot name a class."""
    if isinstance(value, str | int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise row_error(path, line_no, f"field 'label' must be a string or an integer, got {value!r:.40}")


@dataclass
class ClassificationTask(TaskBase):
    """One classification dataset: a train split for the probe and an evaluation split.

    ``instruction`` (optional) goes on every text, train and test alike (E5-mistral / NV-Embed
    embed both with the task instruction).
    """

    name: str
    train_texts: list[str]
    train_labels: list[Any]
    test_texts: list[str]
    test_labels: list[Any]
    split: str = "test"
    samples_per_label: int = 8
    n_experiments: int = 10
    seed: int = DEFAULT_SEED
    max_iter: int = 100
    instruction: str | None = None
    subset: str = "default"
    task_type: ClassVar[str] = "Classification"
    main_metric: ClassVar[str] = "accuracy"
    item_fields: ClassVar[tuple[str, ...]] = ("test_labels", "test_texts")

    def __post_init__(self) -> None:
        if len(self.train_texts) != len(self.train_labels) or len(self.test_texts) != len(self.test_labels):
            raise TaskDataError(f"{self.name}: texts and labels differ in length")

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        name: str | None = None,
        split: str = "test",
        instruction: str | None = None,
        train_split: str = "train",
        **settings: Any,
    ) -> ClassificationTask:
        """Load ``<path>/train.jsonl`` and ``<path>/<split>.jsonl``.

        ``path`` may also be the evaluation file itself; its stem is then the split name.
        """
        directory = Path(path)
        if directory.is_file():
            directory, split = directory.parent, directory.stem
        train_texts, train_labels = load_labelled_texts(split_file(directory, train_split))
        test_texts, test_labels = load_labelled_texts(split_file(directory, split))
        return cls(
            name or directory.name,
            train_texts,
            train_labels,
            test_texts,
            test_labels,
            split=split,
            instruction=instruction,
            **settings,
        )

    def experiments(self) -> list[list[int]]:
        """The train indices of every experiment."""
        return undersample(
            self.train_labels,
            samples_per_label=self.samples_per_label,
            n_experiments=self.n_experiments,
            seed=self.seed,
        )

    def texts(self) -> list[str]:
        """The train texts some experiment uses (in index order), then the evaluation texts."""
        return self._texts(_used(self.experiments()))

    def _texts(self, used: list[int]) -> list[str]:
        return [self.train_texts[i] for i in used] + self.test_texts

    def _scores(self, encoder: RetrievalEncoder, batch_size: int) -> tuple[dict[str, float], dict[str, Any], None]:
        """Run the experiments and average their scores."""
        selections = self.experiments()
        used = _used(selections)
        position = {index: row for row, index in enumerate(used)}
        embeddings = self._embed(encoder, self._texts(used), batch_size)
        train_x, test_x = embeddings[: len(used)], embeddings[len(used) :]
        per_experiment = []
        for chosen in selections:
            rows = [position[i] for i in chosen]
            predicted = fit_and_predict(
                train_x[rows],
                [self.train_labels[i] for i in chosen],
                test_x,
                max_iter=self.max_iter,
                seed=self.seed,
            )
            per_experiment.append(classification_metrics(self.test_labels, predicted))
        scores = _mean_scores(per_experiment)
        scores["main_score"] = scores[self.main_metric]
        extra = {
            "scores_per_experiment": per_experiment,
            "samples_per_label": self.samples_per_label,
            "n_experiments": self.n_experiments,
            "train_examples_embedded": len(used),
        }
        return scores, extra, None
