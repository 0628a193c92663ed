"""Pre-training stages: training steps other than the contrastive trainer's (recipes chain them).

=========== ================================================================ ================
name        what it trains                                                    data
=========== ================================================================ ================
``mntp``    LLM2Vec masked next-token prediction (:mod:`.mntp`)               texts
``simcse``  unsupervised SimCSE, two dropout views (:mod:`.simcse`)           texts
``anchor``  Anchor stage I, EBQ2D + EBD2Q reconstruction (:mod:`.anchor`)     (query, doc)
``angle``   AnglE/CoSENT on scored pairs (:mod:`.angle`)                      scored pairs
``grit``    GritLM: contrastive (bidirectional) + next-token (causal) losses  rows + (prompt, answer)
            on one model (:mod:`.grit`, :mod:`.generative`)
=========== ================================================================ ================

Besides one module per stage, the package holds :mod:`.batches` (reading a stage's items and serving
them in seeded batches) and :mod:`.runner` (building a stage by name, :func:`train_steps`,
:func:`run_objective`). A stage wraps a :class:`~lmembed.training.trainable.TrainableEmbedder` and
exposes ``loss(batch) -> (tensor, metrics)``; :func:`run_objective` trains any of them with the
contrastive trainer's optimisation step (:class:`~lmembed.training.optim.OptimisationStep`: AdamW,
linear warm-up and decay, gradient clipping, ``metrics.jsonl`` logging) plus a loss-curve PNG, and
saves an ordinary Embedder directory (``<output>/model``, LoRA merged) that the next stage loads.
A stage's settings are an :class:`~lmembed.training.train_config.ObjectiveConfig` (re-exported here),
whose ``objective`` field names the stage.

Data (``ObjectiveConfig.data``) are trainer data sources (JSON-lines rows or BEIR folders; texts are
the queries and positives, pairs are (query, first positive)), plain ``.txt`` files (one text per line,
texts only), or, for ``angle``, JSON-lines files of ``{sentence1, sentence2, score}``.
"""

from __future__ import annotations

from lmembed.training.stages.angle import AnglEPairObjective
from lmembed.training.stages.batches import BatchStream, load_items
from lmembed.training.stages.runner import OBJECTIVES, ObjectiveResult, build_objective, run_objective, train_steps
from lmembed.training.train_config import ObjectiveConfig, ObjectiveConfigError

__all__ = [
    "OBJECTIVES",
    "AnglEPairObjective",
    "BatchStream",
    "ObjectiveConfig",
    "ObjectiveConfigError",
    "ObjectiveResult",
    "build_objective",
    "load_items",
    "run_objective",
    "train_steps",
]
