"""Pooling functions: token states → one vector per text.

Every function takes ``hidden`` (batch, tokens, dim) and ``pool_mask`` (batch, tokens), where the
mask is 1 exactly on the tokens that may be pooled: real tokens of the text itself, never padding,
never instruction tokens, never the first copy of an echoed input. Because positions are found from
the mask and not from the sequence length, every pooling gives the same vector under left and right
padding.
"""

from __future__ import annotations

import torch

from lmembed.errors import InputError


def _check_nonempty(pool_mask: torch.Tensor) -> None:
    if bool((pool_mask.sum(dim=1) == 0).any()):
        raise InputError("a text has no poolable tokens (is it empty, or entirely cut by truncation?)")


def first_index(pool_mask: torch.Tensor) -> torch.Tensor:
    """Index of the first poolable token in each row."""
    positions = torch.arange(pool_mask.shape[1], device=pool_mask.device).expand_as(pool_mask)
    big = torch.full_like(positions, pool_mask.shape[1])
    return torch.where(pool_mask.bool(), positions, big).min(dim=1).values


def last_index(pool_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last poolable token in each row."""
    positions = torch.arange(pool_mask.shape[1], device=pool_mask.device).expand_as(pool_mask)
    return torch.where(pool_mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values


def _gather_rows(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), index]


def cls_pool(hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
    """The first poolable token (``[CLS]`` for BERT-style encoders)."""
    _check_nonempty(pool_mask)
    return _gather_rows(hidden, first_index(pool_mask))


def last_pool(hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
    """The last poolable token (EOS pooling for decoders)."""
    _check_nonempty(pool_mask)
    return _gather_rows(hidden, last_index(pool_mask))


def mean_pool(hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
    """Average of the poolable token states."""
    _check_nonempty(pool_mask)
    weights = pool_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


def weighted_mean_pool(
    hidden: torch.Tensor, pool_mask: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Position-weighted mean (SGPT): the i-th poolable token has weight i, so later tokens,
    which have seen more of the text under causal attention, count more.

    With ``attention_mask`` a token's weight is its position among all real tokens instead (tokens left out
    of pooling, such as a prompt, keep their place): sentence-transformers' ``weightedmean``."""
    _check_nonempty(pool_mask)
    mask = pool_mask.to(hidden.dtype)
    counted = mask if attention_mask is None else attention_mask.to(hidden.dtype)
    weights = (torch.cumsum(counted, dim=1) * mask).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


def max_pool(hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over the poolable token states."""
    _check_nonempty(pool_mask)
    return hidden.masked_fill(~pool_mask.bool().unsqueeze(-1), float("-inf")).max(dim=1).values


def mean_sqrt_len_pool(hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
    """Sum of the poolable token states over the square root of their number (sentence-transformers'
    ``mean_sqrt_len_tokens``)."""
    _check_nonempty(pool_mask)
    weights = pool_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).sqrt()


STATELESS_POOLERS = {
    "cls": cls_pool,
    "mean": mean_pool,
    "last": last_pool,
    "weighted_mean": weighted_mean_pool,
    "max": max_pool,
    "mean_sqrt_len": mean_sqrt_len_pool,
}
