"""The int8 quality gate: does a quantised model still give the float32 model's vectors and rankings?

Measured on calibration texts held out from the int8 measurement (the user's own texts), per strategy:

* per-vector cosine between the int8 and the float32 vector of each text (minimum and mean);
* neighbour nDCG@10: each held-out text is a query over the others, the float32 model's ten nearest
  neighbours are the relevant documents (graded by their rank), and the int8 model's ranking is scored
  against them; 1.0 means the same ten neighbours in the same order.

The gate passes when the minimum cosine is at least :data:`MIN_COSINE` and the neighbour nDCG@10 at least
:data:`MIN_NEIGHBOUR_NDCG`; otherwise a warning says which number fell short and by how much. Retrieval
nDCG@10 against human judgements needs judged data: ``bench/int8_retrieval.py`` and ``bench/main_job_time.py``
measure it on BEIR sets.

The neighbour threshold comes from those measurements. A decoder's vectors crowd into a narrow cone, so a mean
cosine of 0.9988 to float32 still reordered neighbours: ``smollm2-135m``'s last-layer strategies with weights
rounded to the nearest level scored 0.979 and 0.982 here and lost 1.3 and 0.5 nDCG@10 points on the main job's
SciFact[500 docs]; every strategy that stayed within 0.35 points (``minilm``, the middle layers, and the last
layers with compensated rounding in one run) scored 0.9878 or more. The cosine threshold alone passed them all.
The gate is coarse, though: 64 texts cannot resolve a retrieval difference of a point. With another calibration
sample the compensated last layer scored 0.9873 and lost 1.2 points; on another 500-document SciFact corpus it
scored 0.9855 with a 1.1-point loss (nearest rounding) and 0.9888 with a 0.8-point loss (compensated); and
``minilm``'s full-SciFact score moved by +0.7 points at 0.9932. It catches a recipe that reorders neighbours
outright; a claim about retrieval quality needs judged data.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import asdict, dataclass

import numpy as np

from lmembed.pooling.normalize import unit_rows

log = logging.getLogger(__name__)

MIN_COSINE = 0.99
#: what torch's dynamic int8 (``backend="torch", precision="int8"``) is gated on when it is loaded: it has no
#: calibration texts of the user's, so short and long sentences of several kinds, read with the float32 model first
GATE_TEXTS = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A monkey is playing drums.",
    "The cat sat on the mat while the dog slept on the rug by the door.",
    "Scurvy is caused by a lack of vitamin C in the diet.",
    "Sailors on long voyages suffered from scurvy until citrus fruit was carried aboard.",
    "What causes the seasons on Earth?",
    "The tilt of the Earth's axis makes the seasons, not its distance from the Sun.",
    "How do vaccines train the immune system?",
    "Vaccines expose the immune system to a harmless part of a pathogen so that it remembers it.",
    "Protein folding determines the shape and function of enzymes in the cell.",
    "Mutations in the BRCA1 gene raise the risk of breast cancer.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "Inflation measures how quickly prices rise across an economy.",
    "To install the package, run the installer and restart the computer.",
    "The function returns None when the list is empty.",
    "Paris is the capital and most populous city of France.",
    "The Great Wall of China stretches for thousands of kilometres.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "A black hole is a region of spacetime from which nothing can escape.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "The team won the championship after a dramatic penalty shoot-out.",
    "hello",
    "search engines rank documents by relevance",
    "neural networks learn representations of text",
    "the quick brown fox jumps over the lazy dog",
    "Rain is expected tomorrow afternoon with strong winds along the coast.",
    "Reading before bed can improve the quality of sleep.",
)
MIN_NEIGHBOUR_NDCG = 0.985
NEIGHBOURS = 10


@dataclass(frozen=True)
class GateReport:
    """Agreement of int8 vectors with float32 ones on texts the int8 model was not fitted to (ONNX Runtime's held-out
    calibration texts, torch's built-in GATE_TEXTS)."""

    texts: int
    min_cosine: float
    mean_cosine: float
    neighbour_ndcg_at_10: float

    @property
    def passed(self) -> bool:
        return self.min_cosine >= MIN_COSINE and self.neighbour_ndcg_at_10 >= MIN_NEIGHBOUR_NDCG

    def shortfalls(self) -> list[str]:
        """What fell below the gate, with the gap."""
        out = []
        if self.min_cosine < MIN_COSINE:
            out.append(f"min cosine {self.min_cosine:.4f} < {MIN_COSINE} (by {MIN_COSINE - self.min_cosine:.4f})")
        if self.neighbour_ndcg_at_10 < MIN_NEIGHBOUR_NDCG:
            gap = MIN_NEIGHBOUR_NDCG - self.neighbour_ndcg_at_10
            out.append(f"neighbour nDCG@10 {self.neighbour_ndcg_at_10:.4f} < {MIN_NEIGHBOUR_NDCG} (by {gap:.4f})")
        return out

    def summary(self) -> str:
        return (
            f"{self.texts} texts: cosine to float32 min {self.min_cosine:.4f} mean {self.mean_cosine:.5f}, "
            f"neighbour nDCG@10 {self.neighbour_ndcg_at_10:.4f}"
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def neighbour_ndcg(reference: np.ndarray, candidate: np.ndarray, k: int = NEIGHBOURS) -> float:
    """Mean nDCG@k of ``candidate``'s neighbour rankings, the reference's top k being relevant (gain k - rank)."""
    ref, cand = unit_rows(reference), unit_rows(candidate)
    n = len(ref)
    k = min(k, n - 1)
    if k < 1:
        return 1.0
    ref_sim, cand_sim = ref @ ref.T, cand @ cand.T
    np.fill_diagonal(ref_sim, -np.inf)
    np.fill_diagonal(cand_sim, -np.inf)
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    scores = []
    for i in range(n):
        top_ref = np.argsort(-ref_sim[i], kind="stable")[:k]
        gains = np.zeros(n)
        gains[top_ref] = np.arange(k, 0, -1)
        top_cand = np.argsort(-cand_sim[i], kind="stable")[:k]
        ideal = float((np.arange(k, 0, -1) * discounts).sum())
        scores.append(float((gains[top_cand] * discounts).sum()) / ideal)
    return float(np.mean(scores))


def gate(reference: np.ndarray, candidate: np.ndarray) -> GateReport:
    """Compare int8 vectors ``candidate`` with float32 vectors ``reference`` (same texts, same order)."""
    cos = (unit_rows(reference) * unit_rows(candidate)).sum(axis=1)
    return GateReport(
        texts=len(reference),
        min_cosine=float(cos.min()) if len(cos) else 1.0,
        mean_cosine=float(cos.mean()) if len(cos) else 1.0,
        neighbour_ndcg_at_10=neighbour_ndcg(reference, candidate),
    )


def announce(report: GateReport, label: str, what: str, advice: str, *, stacklevel: int = 2) -> None:
    """Say a gate's outcome for strategy ``label``: logged when it passed, a warning with each gap when it did not
    (``what``: which int8 was gated; ``advice``: what to do instead). ``stacklevel`` as :func:`warnings.warn`'s, from
    the caller's frame."""
    if report.passed:
        log.info("%s quality gate passed for %s: %s", what, label, report.summary())
        return
    warnings.warn(
        f"{what} quality gate failed for {label}: {'; '.join(report.shortfalls())} ({report.summary()}); {advice}",
        stacklevel=stacklevel + 1,
    )
