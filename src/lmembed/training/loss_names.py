"""How loss names are spelled: the one canonicalisation (case, ``-``/``_``, aliases), free of torch.

:mod:`lmembed.training.losses` registers the losses under these names; :mod:`~lmembed.training.train_config`
checks a config's ``loss`` with the same rule without importing torch (``lmembed --help`` stays light).
"""

from __future__ import annotations

__all__ = ["MATRYOSHKA", "canonical_loss_name"]

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
}


def canonical_loss_name(name: str) -> str:
    """The registered spelling of ``name``: case-insensitive, ``-`` and ``_`` alike, aliases resolved."""
    key = name.strip().lower().replace("-", "_")
    return _ALIASES.get(key, key)
