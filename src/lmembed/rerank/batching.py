"""Forward passes bounded by a token budget: pairs of similar length share a pass, and a pass holds at most
``max_batch_tokens`` padded tokens (pairs x the longest of them) and ``max_batch_size`` pairs. The grouping is
the encoding engine's (:func:`lmembed.encoding.engine.plan_batches`); this module checks the bounds."""

from __future__ import annotations

from collections.abc import Sequence

from lmembed.encoding.engine import plan_batches
from lmembed.errors import ConfigError


def token_batches(lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """Positions into ``lengths``, grouped into passes: sorted longest first (the first pass shows at once
    whether the longest inputs fit in memory), each pass as long as it stays within both bounds. A single
    input longer than the budget goes alone."""
    if max_batch_tokens < 1 or max_batch_size < 1:
        raise ConfigError(f"max_batch_tokens={max_batch_tokens} and max_batch_size={max_batch_size} must be >= 1")
    return plan_batches(lengths, max_batch_size, max_batch_tokens)
