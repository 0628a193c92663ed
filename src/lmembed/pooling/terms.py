"""The term channel: a corpus's own term weighting, appended to each dense vector as a few thousand more dimensions.

A dense encoder ranks by meaning and misses what BM25 sees: the rare words of a corpus (a gene, a drug, a claim's
key term) that a query shares with its document. The term channel puts that signal into the same vector, so any
vector index searches both at once (SPAR's idea of concatenating a lexical channel to a dense one; here the
lexical part is not a trained model but BM25's own weighting, hashed):

* it is **fitted on a corpus** (:func:`fit_terms`): the inverse document frequency of every token id of the
  model's own tokenizer, over the tokens the model pools, and the corpus's mean document length;
* a **document**'s part weighs each of its tokens as BM25 does (``idf x (k1 + 1) tf / (tf + k1 (1 - b + b
  len / avg_len))``), a **query**'s part each of its tokens by its idf; a token the corpus never holds weighs 0;
* the weights are **hashed** into ``dims`` signed buckets (feature hashing: each token id has one bucket and one
  sign, fixed by ``seed``), so a dot product of two parts is the dot product of the sparse weight vectors up to
  the few tokens that share a bucket;
* each part is L2-normalised, as is the dense vector, and scaled by ``sqrt(weight)``: the cosine of two whole
  vectors is ``(cos_dense + weight x cos_terms) / (1 + weight)``.

The idf table lives in the model folder (``terms.safetensors``); the strategy records its sha256, which the loader
checks before the table is used (:func:`load_terms`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import nn

from lmembed.config import TermsConfig
from lmembed.errors import ModelLoadError, UnsafeFileError

TERMS_FILE = "terms.safetensors"
TERMS_TENSOR = "idf"
DOCUMENT_SIDES = (None, "document")  # a text read without a side (STS, clustering) is weighed as a document


#: BM25's idf is ln(1 + (N - n + 0.5) / (n + 0.5)), below 30 for any corpus of up to 10^12 documents
MAX_IDF = 1e3


def table_digest(idf: torch.Tensor) -> str:
    """The sha256 of the idf table's float32 bytes: what the strategy records and the loader checks."""
    return hashlib.sha256(idf.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()).hexdigest()


class TermChannel(nn.Module):
    """The fitted channel: ``forward(input_ids, pool_mask, side)`` gives each text's term part, ``(batch, dims)``,
    L2-normalised and scaled by ``sqrt(weight)`` (all zeros for a text none of whose tokens the corpus holds)."""

    def __init__(self, idf: torch.Tensor, config: TermsConfig) -> None:
        super().__init__()
        if idf.ndim != 1:
            raise ValueError(f"the idf table must be one value per token id, got shape {tuple(idf.shape)}")
        self.config = config
        generator = torch.Generator().manual_seed(config.seed)
        vocab = idf.shape[0]
        self.register_buffer("idf", idf.detach().to(torch.float32).clone(), persistent=False)
        self.register_buffer("bucket", torch.randint(0, config.dims, (vocab,), generator=generator), persistent=False)
        sign = torch.randint(0, 2, (vocab,), generator=generator).to(torch.float32) * 2 - 1
        self.register_buffer("sign", sign, persistent=False)

    @property
    def vocab_size(self) -> int:
        return int(self.idf.shape[0])

    def weights(self, input_ids: torch.Tensor, pool_mask: torch.Tensor, side: str | None) -> torch.Tensor:
        """Each text's term weights over the whole vocabulary, ``(batch, vocab)``, before hashing."""
        # ids come from the tokenizer the table was checked against (Embedder), so no per-batch bound check here
        mask = pool_mask.to(torch.float32)
        counts = torch.zeros(input_ids.shape[0], self.vocab_size, device=input_ids.device)
        counts.scatter_add_(1, input_ids.long(), mask)
        idf = self.idf.to(counts.device)
        if side in DOCUMENT_SIDES:
            cfg = self.config
            length = (mask * (idf[input_ids.long()] > 0)).sum(dim=1, keepdim=True)  # the tokens the table weighs
            norm = cfg.k1 * (1 - cfg.b + cfg.b * length / cfg.avg_length)
            return idf * counts * (cfg.k1 + 1) / (counts + norm)
        return idf * counts

    def forward(self, input_ids: torch.Tensor, pool_mask: torch.Tensor, side: str | None) -> torch.Tensor:
        weights = self.weights(input_ids, pool_mask, side)
        hashed = torch.zeros(weights.shape[0], self.config.dims, device=weights.device)
        hashed.index_add_(1, self.bucket.to(weights.device), weights * self.sign.to(weights.device))
        hashed = nn.functional.normalize(hashed, p=2, dim=-1)  # a zero row stays zero
        return hashed * math.sqrt(self.config.weight)


def fit_terms(
    token_rows: Iterable[Sequence[int]],
    vocab_size: int,
    *,
    dims: int,
    weight: float,
    special_ids: Iterable[int] = (),
    k1: float = 1.2,
    b: float = 0.75,
    seed: int = 0,
) -> TermChannel:
    """Fit the channel on a corpus: ``token_rows`` are its documents' pooled token ids (as the model reads them),
    ``vocab_size`` the tokenizer's number of ids. Special tokens weigh 0, as do ids no document holds."""
    frequency = torch.zeros(vocab_size, dtype=torch.float64)
    documents = 0
    total = 0
    special = torch.tensor(sorted(set(special_ids)), dtype=torch.long)
    for row in token_rows:
        ids = torch.tensor(list(row), dtype=torch.long)
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise ValueError(f"token id {int(ids.max())} is outside the tokenizer's {vocab_size} ids")
        kept = ids[~torch.isin(ids, special)] if special.numel() else ids
        frequency[torch.unique(kept)] += 1
        documents += 1
        total += kept.numel()
    if documents == 0 or total == 0:
        raise ValueError("the term channel needs a corpus with at least one token to fit on")
    idf = torch.log((documents - frequency + 0.5) / (frequency + 0.5) + 1.0)  # BM25's idf, never negative
    idf[frequency == 0] = 0.0
    config = TermsConfig(
        dims=dims,
        weight=weight,
        k1=k1,
        b=b,
        avg_length=total / documents,
        seed=seed,
        documents=documents,
        sha256=table_digest(idf.to(torch.float32)),
    )
    return TermChannel(idf.to(torch.float32), config)


def save_terms(channel: TermChannel, directory: Path) -> Path:
    """Write the channel's idf table into ``directory`` (atomically) and return its path."""
    from safetensors.torch import save

    from lmembed.atomic import atomic_write

    data = save({TERMS_TENSOR: channel.idf.detach().cpu().contiguous()})
    return atomic_write(directory / TERMS_FILE, lambda handle: handle.write(data))


def load_terms(directory: Path, config: TermsConfig, vocab_size: int, strategy_file: Path) -> TermChannel:
    """Read and check a saved channel: the file lies in the folder, holds one float32 table of one value per token
    id of the tokenizer (checked in its header before anything is read), every value finite and not negative, and
    its bytes hash to the strategy's ``terms.sha256``. Each refusal names the file and the field."""
    from safetensors import safe_open

    from lmembed.models.weights import read_safetensors_header
    from lmembed.paths import inside

    path = inside(directory, TERMS_FILE, file=strategy_file, field="strategy.terms")
    if not path.is_file():
        raise ModelLoadError(f"{strategy_file}: strategy.terms is set, but {path} is missing")
    shapes = read_safetensors_header(path)
    if set(shapes) != {TERMS_TENSOR} or shapes[TERMS_TENSOR] != (vocab_size,):
        raise ModelLoadError(
            f"{path}: holds {shapes}, but the term channel needs one tensor {TERMS_TENSOR!r} of shape ({vocab_size},) "
            "(one value per token id of the model's tokenizer)"
        )
    with safe_open(str(path), framework="pt") as handle:
        idf = handle.get_tensor(TERMS_TENSOR)
    if idf.dtype != torch.float32:
        raise ModelLoadError(f"{path}: {TERMS_TENSOR} is {idf.dtype}, the term channel's table is float32")
    if not bool(torch.isfinite(idf).all()) or bool((idf < 0).any()):
        raise ModelLoadError(f"{path}: {TERMS_TENSOR} holds a negative or non-finite weight")
    if idf.numel() and float(idf.max()) > MAX_IDF:  # finite, yet it overflowed the vectors, and the model was blamed
        raise ModelLoadError(
            f"{path}: {TERMS_TENSOR} holds {float(idf.max()):.3g}, past any BM25 weight (at most {MAX_IDF:g})"
        )
    digest = table_digest(idf)
    if digest != config.sha256:
        raise UnsafeFileError(
            f"{path}: its table hashes to sha256 {digest[:16]}..., but {strategy_file} field strategy.terms.sha256 "
            f"records {config.sha256[:16]}...: the file is not the one the model was saved with"
        )
    return TermChannel(idf, config)
