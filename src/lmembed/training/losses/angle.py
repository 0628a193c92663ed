"""AnglE: angle-optimised text embeddings (Li & Li, 2023, "AnglE-optimized Text Embeddings").

Cosine similarity saturates near ±1, where its gradient vanishes, so pairs that are already fairly
similar or dissimilar stop teaching the model anything. AnglE adds a ranking objective on an angle
difference measured in complex space, meant to keep a useful gradient there, and combines it with two
familiar terms. All three are weighted and summed:

1. **Cosine (CoSENT) term.** For any two pairs where pair ``i`` has a higher gold score than pair
   ``j``, penalise ``cos_j > cos_i``:  ``log(1 + Σ_{y_i > y_j} exp(λ (cos_j - cos_i)))``.
2. **In-batch negative term.** Pairs whose score reaches ``positive_threshold`` are treated as
   positives: every text of such a pair must identify its partner among all other ``2B - 1`` texts
   in the batch (cross-entropy on scaled cosine similarities).
3. **Angle term.** Each embedding is read as a complex vector ``z = a + i b`` (first half real, second
   half imaginary). The normalised complex inner product ``<z, w> / (|z| |w|) = ρ e^{iΔθ}`` of a pair
   carries both a magnitude ``ρ`` and the angle difference ``Δθ``; the pair's angle score is
   ``|Re + Im| = ρ |cos Δθ + sin Δθ|`` of it, which for ``w = c + i d`` expands to
   ``|(a·c + b·d) + (b·c - a·d)| / (|z| |w|)``. This is the quantity the reference implementation
   obtains from the complex division ``z / w`` followed by its norm rescaling. The same CoSENT
   ranking is then applied to these scores.

Input signature (differs from the retrieval losses): ``text1 [B, D]``, ``text2 [B, D]`` and
``scores [B]``, a gold similarity per pair (binary labels or graded STS scores; only their order
matters for terms 1 and 3). Odd ``D`` is zero-padded by one for the complex split.

Weights and scales: the reference implementation's defaults have changed between releases, so the
defaults here are neutral (all weights 1, all scales 20); set them from the recipe being reproduced.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["AnglELoss", "angle_similarity", "cosent_loss", "in_batch_pair_loss"]


def cosent_loss(predicted: Tensor, labels: Tensor, scale: float = 20.0) -> Tensor:
    """Ranking loss that wants ``predicted`` ordered like ``labels`` (both ``[B]``).

    Every ordered pair ``(i, j)`` with ``labels[i] > labels[j]`` contributes
    ``exp(scale * (predicted[j] - predicted[i]))`` inside ``log(1 + Σ ...)``.
    """
    gaps = scale * (predicted.unsqueeze(0) - predicted.unsqueeze(1))  # gaps[i, j] = s_j - s_i
    should_rank_higher = labels.unsqueeze(1) > labels.unsqueeze(0)
    terms = gaps[should_rank_higher]
    return torch.logsumexp(torch.cat([terms.new_zeros(1), terms]), dim=0)


def _pad_to_even(x: Tensor) -> Tensor:
    return F.pad(x, (0, 1)) if x.size(-1) % 2 else x


def angle_similarity(x: Tensor, y: Tensor) -> Tensor:
    """AnglE's complex-space pair score for row-aligned ``x, y [B, D]``; higher means closer in angle."""
    x, y = _pad_to_even(x), _pad_to_even(y)
    a, b = x.chunk(2, dim=-1)  # z = a + i b
    c, d = y.chunk(2, dim=-1)  # w = c + i d
    norms = x.norm(dim=-1) * y.norm(dim=-1)
    # <z, w> = Σ z_k conj(w_k): real part a·c + b·d, imaginary part b·c - a·d.
    real = (a * c + b * d).sum(dim=-1)
    imaginary = (b * c - a * d).sum(dim=-1)
    return ((real + imaginary) / norms.clamp_min(1e-12)).abs()


def in_batch_pair_loss(text1: Tensor, text2: Tensor, is_positive: Tensor, scale: float = 20.0) -> Tensor:
    """Each text of a positive pair must retrieve its partner among the other ``2B - 1`` texts."""
    batch = text1.size(0)
    texts = F.normalize(torch.cat([text1, text2]), dim=-1)
    logits = scale * texts @ texts.T
    eye = torch.eye(2 * batch, dtype=torch.bool, device=logits.device)
    logits = logits.masked_fill(eye, float("-inf"))
    rows = torch.arange(batch, device=logits.device)
    partners = torch.cat([rows + batch, rows])
    keep = torch.cat([is_positive, is_positive])
    if not bool(keep.any()):
        return logits.new_zeros(()) + 0.0 * (text1.sum() + text2.sum())  # keep the graph connected
    return F.cross_entropy(logits[keep], partners[keep])


class AnglELoss(nn.Module):
    """Weighted sum of the CoSENT, in-batch negative and angle objectives for scored text pairs.

    Args:
        cosine_weight, ibn_weight, angle_weight: weights of the three terms (0 switches one off).
        cosine_scale, ibn_scale, angle_scale: multipliers (inverse temperatures) inside each term.
        positive_threshold: pairs with ``score >= positive_threshold`` are positives for the in-batch
            term. 0.5 suits binary labels; use e.g. 4.0 for 0-5 STS scores.

    Call with ``text1 [B, D]``, ``text2 [B, D]``, ``scores [B]``.
    """

    def __init__(
        self,
        cosine_weight: float = 1.0,
        ibn_weight: float = 1.0,
        angle_weight: float = 1.0,
        cosine_scale: float = 20.0,
        ibn_scale: float = 20.0,
        angle_scale: float = 20.0,
        positive_threshold: float = 0.5,
    ) -> None:
        super().__init__()
        self.cosine_weight = cosine_weight
        self.ibn_weight = ibn_weight
        self.angle_weight = angle_weight
        self.cosine_scale = cosine_scale
        self.ibn_scale = ibn_scale
        self.angle_scale = angle_scale
        self.positive_threshold = positive_threshold

    def forward(self, text1: Tensor, text2: Tensor, scores: Tensor) -> Tensor:
        if text1.shape != text2.shape or scores.shape != text1.shape[:1]:
            raise ValueError(
                f"expected text1/text2 [B, D] and scores [B], got {tuple(text1.shape)}, "
                f"{tuple(text2.shape)}, {tuple(scores.shape)}"
            )
        scores = scores.to(text1.device)
        total = text1.new_zeros(())
        if self.cosine_weight:
            cosines = F.cosine_similarity(text1, text2, dim=-1)
            total = total + self.cosine_weight * cosent_loss(cosines, scores, self.cosine_scale)
        if self.ibn_weight:
            positives = scores >= self.positive_threshold
            total = total + self.ibn_weight * in_batch_pair_loss(text1, text2, positives, self.ibn_scale)
        if self.angle_weight:
            angles = angle_similarity(text1, text2)
            total = total + self.angle_weight * cosent_loss(angles, scores, self.angle_scale)
        return total

    def extra_repr(self) -> str:
        return (
            f"weights=(cosine={self.cosine_weight}, ibn={self.ibn_weight}, angle={self.angle_weight}), "
            f"scales=(cosine={self.cosine_scale}, ibn={self.ibn_scale}, angle={self.angle_scale}), "
            f"positive_threshold={self.positive_threshold}"
        )
