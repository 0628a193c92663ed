"""How loss names are spelled: the one canonicalisation (case, ``-``/``_``, aliases), free of torch.

:mod:`lmembed.training.losses` registers the losses under these names; :mod:`~lmembed.training.train_config`
checks a config's ``loss`` with the same rule without importing torch (``lmembed --help`` stays light).
"""

from __future__ import annotations

__all__ = ["MATRYOSHKA", "NEEDS_NEGATIVES", "canonical_loss_name"]

#: The wrapper's name: it takes another loss (``inner``) rather than being one.
MATRYOSHKA = "matryoshka"

_ALIASES = {
    "info_nce": "infonce",
    "contrastive": "infonce",
    "mnrl": "infonce",
    "gte_icl": "gte",
    "improved_contrastive": "gte",
    "cosent_angle": "angle",
    "mrl": MATRYOSHKA,
    "2dmse": "matryoshka_2d",
    "2d_matryoshka": "matryoshka_2d",
    "listwise": "listwise_softmax",
    "pointwise": "pointwise_bce",
    "bce": "pointwise_bce",
    "marginmse": "margin_mse",
    "kl": "distill_kl",
    "listwise_kl": "distill_kl",
    "kl_distill": "distill_kl",
}

#: Losses that compare each row's positive with its own hard negatives: they need ``num_negatives >= 1``.
NEEDS_NEGATIVES = frozenset({"triplet", "margin_mse", "distill_kl"})


def canonical_loss_name(name: str) -> str:
    """The registered spelling of ``name``: case-insensitive, ``-`` and ``_`` alike, aliases resolved."""
    key = name.strip().lower().replace("-", "_")
    return _ALIASES.get(key, key)
