"""Clustering scored by V-measure, with either of MTEB's two protocols.

The data is MTEB's clustering format: each jsonl row is one *sub-set* ``{"sentences": [...],
"labels": [...]}``.

``protocol="legacy"`` (MTEB's ``AbsTaskClustering`` in 1.x, ``AbsTaskClusteringLegacy`` in 2.x):
each sub-set is embedded and clustered with ``MiniBatchKMeans(n_clusters=<distinct labels in the
sub-set>, batch_size=500, n_init="auto", random_state=42)``; the sub-set's score is the V-measure of
the assignment against the labels, and the task score is the mean over sub-sets (``v_measure``, also
``v_measure_std`` and the per-sub-set list). A sub-set with a single label scores 1.0 without
clustering, as in MTEB 2.x. mteb 1.x seeded the global NumPy generator with 42 before each sub-set,
which is the same stream as ``random_state=42``: under the scikit-learn MTEB ran (1.5.1) this gives
its published scores set by set; ``MiniBatchKMeans`` changed after that release, so with a later one
the same embeddings cluster differently. BiorxivClusteringS2S, TwentyNewsgroupsClustering ... are
scored this way.

``protocol="bootstrap"`` (MTEB's ``AbsTaskClusteringFast`` in 1.x, ``AbsTaskClustering`` in 2.x,
the ``.v2`` tasks and SIB200ClusteringS2S): the sub-sets are pooled; ``random.Random(seed)`` picks the
documents to embed (``max_documents``, or ``max_fraction`` of them; all when neither is set) and
then draws ``bootstrap_runs`` samples of ``bootstrap_size`` documents *with replacement*; each sample
is clustered with ``MiniBatchKMeans(batch_size=512, init="k-means++", n_init=1,
random_state=seed)`` and scored by V-measure. Labels that are lists are hierarchical: every level is
scored on the documents that have it. The task score is the mean over all runs and levels.
mteb 1.x left that k-means unseeded (the global NumPy generator, whose state depended on the
languages evaluated before), so its published numbers carry k-means noise no seed reproduces;
``bench/mteb_fidelity.py`` reports that spread.

The items (for paired comparisons) are the V-measures the task score averages.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
from sklearn.cluster import MiniBatchKMeans
from sklearn.metrics.cluster import v_measure_score

from lmembed.evaluation.base import ItemScores, ShrinkLimits
from lmembed.evaluation.tasks._common import (
    DEFAULT_SEED,
    TaskBase,
    TaskDataError,
    read_numbered_jsonl,
    row_error,
    sample_indices,
    text_value,
)
from lmembed.protocols import RetrievalEncoder

KMEANS_BATCH_SIZE = 500
#: The bootstrap protocol's settings, MTEB's defaults.
BOOTSTRAP_KMEANS_BATCH_SIZE = 512
BOOTSTRAP_RUNS = 10
BOOTSTRAP_SIZE = 16_384
PROTOCOLS = ("legacy", "bootstrap")


@dataclass
class ClusterSet:
    """One sub-set to cluster: sentences and their gold labels."""

    sentences: list[str]
    labels: list[Any]


def cluster_v_measure(
    embeddings: np.ndarray,
    labels: Sequence[Any],
    *,
    batch_size: int = KMEANS_BATCH_SIZE,
    seed: int = DEFAULT_SEED,
) -> float:
    """Cluster ``embeddings`` into as many groups as ``labels`` has values; return the V-measure."""
    n_clusters = len(set(labels))
    if n_clusters <= 1:
        return 1.0
    model = MiniBatchKMeans(n_clusters=n_clusters, batch_size=batch_size, n_init="auto", random_state=seed)
    model.fit(embeddings)
    return float(v_measure_score(list(labels), model.labels_))


def bootstrap_v_measures(
    embeddings: np.ndarray,
    labels: Sequence[Any],
    *,
    rng: random.Random,
    runs: int = BOOTSTRAP_RUNS,
    size: int = BOOTSTRAP_SIZE,
    batch_size: int = BOOTSTRAP_KMEANS_BATCH_SIZE,
    seed: int = DEFAULT_SEED,
) -> dict[str, list[float]]:
    """V-measure of ``runs`` k-means clusterings, each of ``size`` documents drawn with replacement by ``rng``.

    A label that is a list is a path of hierarchical labels; level ``i`` is scored on the documents whose
    path has an ``i``-th entry, found as mteb finds them: a missing entry is written ``-1`` and every label equal
    to ``-1`` after numpy's conversion of the level's labels is left out (so an integer label ``-1`` is dropped
    too, while with string labels a missing entry becomes the string ``"-1"`` and stays, as a cluster of its
    own). Returns ``{"Level i": [one V-measure per run]}``.
    """
    paths = [list(label) if isinstance(label, list | tuple) else [label] for label in labels]
    out: dict[str, list[float]] = {}
    for level in range(max((len(p) for p in paths), default=0)):
        written = np.array([p[level] if len(p) > level else -1 for p in paths])
        kept = np.array([label != -1 for label in written], dtype=bool)
        level_labels = written[kept]
        level_embeddings = embeddings[kept]
        model = MiniBatchKMeans(
            n_clusters=np.unique(level_labels).size,
            batch_size=batch_size,
            init="k-means++",
            n_init=1,
            random_state=seed,
        )
        scores = []
        for _ in range(runs):
            picks = rng.choices(range(len(level_labels)), k=size)
            assignment = model.fit_predict(level_embeddings[picks])
            scores.append(float(v_measure_score(level_labels[picks], assignment)))
        out[f"Level {level}"] = scores
    return out


def load_cluster_sets(path: str | Path) -> list[ClusterSet]:
    """Read MTEB-format clustering rows ``{"sentences": [...], "labels": [...]}``."""
    sets = []
    for line_no, row in read_numbered_jsonl(path):
        sentences, labels = row.get("sentences"), row.get("labels")
        if not isinstance(sentences, list) or not isinstance(labels, list):
            raise row_error(path, line_no, "needs list-valued 'sentences' and 'labels'")
        if len(sentences) != len(labels):
            raise row_error(path, line_no, f"has {len(sentences)} sentences, {len(labels)} labels")
        texts = [text_value(text, f"field 'sentences[{i}]'", path, line_no) for i, text in enumerate(sentences)]
        sets.append(ClusterSet(texts, labels))  # a null or a number was embedded as the text "None", "3" before
    return sets


@dataclass
class ClusteringTask(TaskBase):
    """One clustering dataset made of sub-sets, scored with ``protocol`` (see the module's docstring).

    ``kmeans_batch_size`` defaults to the protocol's (500 legacy, 512 bootstrap); ``max_documents`` /
    ``max_fraction`` / ``bootstrap_runs`` / ``bootstrap_size`` apply to the bootstrap protocol only.
    ``instruction`` (optional) goes on every sentence (E5-mistral / NV-Embed).
    """

    name: str
    sets: list[ClusterSet]
    split: str = "test"
    protocol: str = "legacy"
    kmeans_batch_size: int | None = None
    seed: int = DEFAULT_SEED
    max_documents: int | None = None
    max_fraction: float | None = None
    bootstrap_runs: int = BOOTSTRAP_RUNS
    bootstrap_size: int = BOOTSTRAP_SIZE
    instruction: str | None = None
    subset: str = "default"
    task_type: ClassVar[str] = "Clustering"
    main_metric: ClassVar[str] = "v_measure"

    @classmethod
    def _read(cls, file: Path) -> tuple[list[ClusterSet]]:
        return (load_cluster_sets(file),)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise TaskDataError(
                f"{self.name}: protocol={self.protocol!r} is unknown; choose one of {', '.join(PROTOCOLS)}"
            )
        if self.max_documents is not None and self.max_fraction is not None:
            raise TaskDataError(f"{self.name}: set max_documents or max_fraction, not both")

    def _bootstrap_pool(self) -> tuple[list[str], list[Any], random.Random]:
        """The pooled documents the bootstrap protocol embeds, in MTEB's order, and the generator it goes on with."""
        sentences = [s for cluster_set in self.sets for s in cluster_set.sentences]
        labels = [label for cluster_set in self.sets for label in cluster_set.labels]
        rng = random.Random(self.seed)
        if self.max_documents is None and self.max_fraction is None:
            return sentences, labels, rng
        keep = self.max_documents if self.max_documents is not None else int(self.max_fraction * len(sentences))
        picks = rng.sample(range(len(sentences)), k=min(len(sentences), keep))
        return [sentences[i] for i in picks], [labels[i] for i in picks], rng

    def texts(self) -> list[str]:
        """The sentences this task embeds, in the order :meth:`cluster_scores` expects their embeddings."""
        if self.protocol == "bootstrap":
            return self._bootstrap_pool()[0]
        return [s for cluster_set in self.sets if len(set(cluster_set.labels)) > 1 for s in cluster_set.sentences]

    def cluster_scores(self, embeddings: np.ndarray, kmeans_seed: int | None = None) -> dict[str, Any]:
        """V-measures from the embeddings of :meth:`texts`: ``v_measures`` (the flat list the task score
        averages: one per sub-set, or one per bootstrap run and level) and, for the bootstrap protocol,
        ``v_measures_by_level``. ``kmeans_seed`` replaces the task's seed for k-means only (the documents
        drawn stay the same): how much a score owes to the k-means initialisation."""
        seed = self.seed if kmeans_seed is None else kmeans_seed
        if self.protocol == "bootstrap":
            _, labels, rng = self._bootstrap_pool()
            by_level = bootstrap_v_measures(
                embeddings,
                labels,
                rng=rng,
                runs=self.bootstrap_runs,
                size=self.bootstrap_size,
                batch_size=self.kmeans_batch_size or BOOTSTRAP_KMEANS_BATCH_SIZE,
                seed=seed,
            )
            return {"v_measures": [v for level in by_level.values() for v in level], "v_measures_by_level": by_level}
        v_measures, start = [], 0
        for cluster_set in self.sets:
            if len(set(cluster_set.labels)) <= 1:
                v_measures.append(1.0)
                continue
            stop = start + len(cluster_set.sentences)
            v_measures.append(
                cluster_v_measure(
                    embeddings[start:stop],
                    cluster_set.labels,
                    batch_size=self.kmeans_batch_size or KMEANS_BATCH_SIZE,
                    seed=seed,
                )
            )
            start = stop
        return {"v_measures": v_measures}

    def shrink(self, limits: ShrinkLimits) -> Self:
        """Each sub-set on at most ``max_items`` sentences drawn by ``default_rng(seed)`` (one generator for
        all sets, in order), named ``Name[40 per set]``; itself when no set is larger."""
        keep = limits.max_items
        if keep is None or all(len(s.sentences) <= keep for s in self.sets):
            return self
        rng = np.random.default_rng(limits.seed)
        sets = []
        for cluster_set in self.sets:
            index = sample_indices(len(cluster_set.sentences), keep, rng) or list(range(len(cluster_set.sentences)))
            sets.append(ClusterSet([cluster_set.sentences[i] for i in index], [cluster_set.labels[i] for i in index]))
        return dataclasses.replace(self, name=f"{self.name}[{keep} per set]", sets=sets)

    def _scores(
        self, encoder: RetrievalEncoder, batch_size: int
    ) -> tuple[dict[str, float], dict[str, Any], ItemScores]:
        """Embed every distinct sentence once, cluster as the protocol says, average the V-measures."""
        details = self.cluster_scores(self._embed(encoder, self.texts(), batch_size))
        v_measures = details["v_measures"]
        scores = {
            "v_measure": float(np.mean(v_measures)),
            "v_measure_std": float(np.std(v_measures)),
        }
        scores["main_score"] = scores["v_measure"]
        return scores, {**details, "protocol": self.protocol}, ItemScores.numbered("mean", v_measures)
