"""Interfaces shared across the pipeline, as structural types.

Evaluation, mining and serving code depend on these protocols, never on a concrete class, so any
object with the right methods (an lmembed ``Embedder``, a test double, a wrapped third-party model)
can be plugged in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class TextEncoder(Protocol):
    """Anything that turns texts into a float32 matrix, one row per text, in input order."""

    def encode(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray: ...


@runtime_checkable
class RetrievalEncoder(Protocol):
    """An encoder that treats queries and documents asymmetrically.

    ``instruction`` is a task description given to the query side only; implementations keep it
    out of the pooled representation where they can.
    """

    def encode_queries(
        self, texts: Sequence[str], *, instruction: str | None = None, batch_size: int = 32
    ) -> np.ndarray: ...

    def encode_corpus(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray: ...
