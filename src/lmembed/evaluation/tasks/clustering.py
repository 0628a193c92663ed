"""Clustering scored by V-measure, following MTEB's (legacy) ``AbsTaskClustering``.

The data is MTEB's clustering format: each jsonl row is one *sub-set* ``{"sentences": [...],
"labels": [...]}``. For each sub-set the sentences are embedded and clustered with
``MiniBatchKMeans(n_clusters=<distinct labels in the sub-set>, batch_size=500, n_init="auto",
random_state=42)``; the sub-set's score is the V-measure of the cluster assignment against the
labels. The task score is the mean over sub-sets (``v_measure``, also ``v_measure_std`` and the
per-sub-set list). A sub-set with a single label scores 1.0 without clustering, as in MTEB 2.x.

Settings match MTEB: mteb 1.x's ``ClusteringEvaluator`` used ``batch_size=500`` and
``n_init="auto"`` with the global NumPy generator freshly seeded with 42 by ``Evaluator.__init__``,
which is the same stream as ``random_state=42`` (what mteb 2.x's legacy clustering passes). This is
the protocol of the tasks named BiorxivClusteringS2S, MedrxivClusteringS2S,
TwentyNewsgroupsClustering ... in MTEB; their ``.v2`` variants (bootstrapped "fast" clustering) are
a different protocol and are not implemented here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from sklearn.cluster import MiniBatchKMeans
from sklearn.metrics.cluster import v_measure_score

from lmembed.evaluation.tasks._common import DEFAULT_SEED, TaskBase, TaskDataError, read_rows
from lmembed.protocols import RetrievalEncoder

KMEANS_BATCH_SIZE = 500


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


def load_cluster_sets(path: str | Path) -> list[ClusterSet]:
    """Read MTEB-format clustering rows ``{"sentences": [...], "labels": [...]}``."""
    rows = read_rows(path, ("sentences", "labels"))
    sets = []
    for number, row in enumerate(rows, start=1):
        sentences, labels = row.get("sentences"), row.get("labels")
        if not isinstance(sentences, list) or not isinstance(labels, list):
            raise TaskDataError(f"{path}: row {number} needs list-valued 'sentences' and 'labels'")
        if len(sentences) != len(labels):
            raise TaskDataError(f"{path}: row {number} has {len(sentences)} sentences, {len(labels)} labels")
        sets.append(ClusterSet([str(s) for s in sentences], labels))
    return sets


@dataclass
class ClusteringTask(TaskBase):
    """One clustering dataset made of sub-sets, each clustered separately.

    ``instruction`` (optional) goes on every sentence (E5-mistral / NV-Embed).
    """

    name: str
    sets: list[ClusterSet]
    split: str = "test"
    kmeans_batch_size: int = KMEANS_BATCH_SIZE
    seed: int = DEFAULT_SEED
    instruction: str | None = None
    subset: str = "default"
    task_type: ClassVar[str] = "Clustering"
    main_metric: ClassVar[str] = "v_measure"

    @classmethod
    def _read(cls, file: Path) -> tuple[list[ClusterSet]]:
        return (load_cluster_sets(file),)

    def _scores(self, encoder: RetrievalEncoder, batch_size: int) -> tuple[dict[str, float], dict[str, Any]]:
        """Embed every distinct sentence once, cluster each sub-set, average the V-measures."""
        to_embed = [s for cluster_set in self.sets if len(set(cluster_set.labels)) > 1 for s in cluster_set.sentences]
        embeddings = self._embed(encoder, to_embed, batch_size)
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
                    batch_size=self.kmeans_batch_size,
                    seed=self.seed,
                )
            )
            start = stop
        scores = {
            "v_measure": float(np.mean(v_measures)),
            "v_measure_std": float(np.std(v_measures)),
        }
        scores["main_score"] = scores["v_measure"]
        return scores, {"v_measures": v_measures}
