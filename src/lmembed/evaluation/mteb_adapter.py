"""Let the ``mteb`` package (2.x) evaluate any lmembed encoder.

:class:`MTEBEncoder` implements mteb's ``EncoderProtocol`` (``mteb/models/models_protocols.py``):
``encode(inputs: DataLoader, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs)``
plus ``similarity``/``similarity_pairwise`` (cosine) and ``mteb_model_meta``. Each call is routed by
mteb's prompt type:

* ``PromptType.query``    → ``encode_queries(texts, instruction=<task instruction>)``
* ``PromptType.document`` → ``encode_corpus(texts)`` (documents never get an instruction)
* no prompt type (STS, classification, clustering, pair classification, summarization) → the
  symmetric path: ``encode_queries(texts, instruction=...)`` on every text when the task has an
  instruction, otherwise the texts as they are (``encode`` or ``encode_corpus``), the same rule
  lmembed's own tasks follow, so both report the same numbers.

The task instruction comes from ``instructions`` (a table name such as ``"nv-embed"`` or a mapping
task name → definition); left out for a published model (an Embedder loaded as one of
:mod:`lmembed.models.presets`' families), it is the table that model's scores were produced with
(:func:`~lmembed.evaluation.instructions.published_instructions`: Qwen3-Embedding's own, mteb's for the others);
with ``use_task_prompts=True`` a task missing from it falls back to the ``prompt`` in the mteb task's metadata.
mteb is an optional dependency (``pip install lmembed[compare]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lmembed.errors import ConfigError
from lmembed.evaluation.instructions import instruction_set, published_instructions
from lmembed.evaluation.tasks._common import as_matrix, encode_symmetric
from lmembed.protocols import ENCODE_BATCH_SIZE, RetrievalEncoder

try:
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction
    from mteb.types import PromptType
except ImportError as exc:  # pragma: no cover - exercised only without the optional dependency
    raise ImportError("lmembed.evaluation.mteb_adapter needs mteb 2.x: pip install 'mteb>=2,<3'") from exc

if TYPE_CHECKING:
    from mteb.abstasks.task_metadata import TaskMetadata
    from torch.utils.data import DataLoader

_SIMILARITIES = {"cosine": ScoringFunction.COSINE, "dot": ScoringFunction.DOT_PRODUCT}


def _model_meta(name: str, revision: str, similarity: str) -> ModelMeta:
    """A minimal ModelMeta naming the model (mteb files its results under it)."""
    if similarity not in _SIMILARITIES:
        raise ConfigError(f"similarity must be one of {sorted(_SIMILARITIES)}, got {similarity!r}")
    return ModelMeta.create_empty(
        overwrites={"name": name, "revision": revision, "similarity_fn_name": _SIMILARITIES[similarity]}
    )


def _texts(inputs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The texts of every batch of an mteb dataloader, in order."""
    return [str(text) for batch in inputs for text in batch["text"]]


class MTEBEncoder(AbsEncoder):
    """An lmembed encoder presented to mteb as an ``EncoderProtocol`` model."""

    def __init__(
        self,
        encoder: RetrievalEncoder,
        *,
        model_name: str = "lmembed/encoder",
        revision: str = "local",
        instructions: str | Mapping[str, str] | None = None,
        use_task_prompts: bool = False,
        similarity: str = "cosine",
    ) -> None:
        self.encoder = encoder
        self.model = encoder
        self.mteb_model_meta = _model_meta(model_name, revision, similarity)
        if instructions is None:  # a published model: the instructions its own scores were produced with
            instructions = published_instructions(getattr(encoder, "published", None))
        self.instructions: Mapping[str, str] = instruction_set(instructions) if instructions is not None else {}
        self.use_task_prompts = use_task_prompts

    def task_instruction(self, task_metadata: TaskMetadata, prompt_type: PromptType | None) -> str | None:
        """The definition to use for this task and input side (``None`` for documents)."""
        if prompt_type == PromptType.document:
            return None
        instruction = self.instructions.get(task_metadata.name)
        if instruction is None and self.use_task_prompts:
            prompt = task_metadata.prompt
            if isinstance(prompt, dict):
                prompt = prompt.get((prompt_type or PromptType.query).value)
            instruction = prompt or None
        return instruction

    def encode(
        self,
        inputs: DataLoader[Any],
        *,
        task_metadata: TaskMetadata,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Embed one mteb dataloader's texts through the matching lmembed method."""
        texts = _texts(inputs)
        batch_size = int(kwargs.get("batch_size", ENCODE_BATCH_SIZE))
        instruction = self.task_instruction(task_metadata, prompt_type)
        if prompt_type == PromptType.document:
            return as_matrix(self.encoder.encode_corpus(texts, batch_size=batch_size))
        if prompt_type == PromptType.query:
            return as_matrix(self.encoder.encode_queries(texts, instruction=instruction, batch_size=batch_size))
        return encode_symmetric(self.encoder, texts, instruction=instruction, batch_size=batch_size)


def evaluate_with_mteb(
    encoder: RetrievalEncoder | MTEBEncoder,
    tasks: Any,
    *,
    batch_size: int = ENCODE_BATCH_SIZE,
    **kwargs: Any,
) -> Any:
    """Run ``mteb.evaluate`` on ``tasks`` for an lmembed encoder, without mteb's results cache.

    Returns mteb's ``ModelResult``; other keyword arguments go to :func:`mteb.evaluate`.
    """
    import mteb  # lazy: mteb is an optional extra (compare)

    model = encoder if isinstance(encoder, MTEBEncoder) else MTEBEncoder(encoder)
    kwargs.setdefault("cache", None)
    kwargs.setdefault("show_progress_bar", False)
    return mteb.evaluate(model, tasks, encode_kwargs={"batch_size": batch_size}, **kwargs)


def main_scores(model_result: Any, split: str = "test") -> dict[str, float]:
    """Task name → main score (first subset) from an mteb ``ModelResult``."""
    scores: dict[str, float] = {}
    for task_result in model_result.task_results:
        scores[task_result.task_name] = float(task_result.scores[split][0]["main_score"])
    return scores
