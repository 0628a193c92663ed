"""Second-stage rerankers: a model reads a query and a document together and scores their relevance.

=================== ==================================================================================
module              holds
=================== ==================================================================================
``base``            :class:`Reranker`: pairs → scores in token-budgeted batches, ``rank``, save/load
``cross_encoder``   :class:`CrossEncoderReranker`: any model with a sequence-classification head (an
                    encoder such as MiniLM, or a decoder scored at its last token as RankLLaMA is), read
                    from and written in sentence-transformers' ``CrossEncoder`` format
``llm``             :class:`LLMReranker`: any causal LM, scored by the log-odds of "yes" against "no" after a
                    relevance prompt (Qwen3-Reranker's recipe)
``loading``         :func:`load_reranker`: either kind from a folder (by what it holds), a bundled name or a Hub id
``batching``        grouping pairs into forward passes bounded by padded tokens
=================== ==================================================================================

    >>> reranker = load_reranker("path/to/cross-encoder")          # either kind, from a folder or a Hub id
    >>> reranker.rank("what causes cancer?", ["doc one", "doc two"], top_k=1)   # [Ranked(index, score)]
"""

from lmembed.rerank.base import Ranked, Reranker
from lmembed.rerank.cross_encoder import CrossEncoderReranker
from lmembed.rerank.llm import LLMReranker
from lmembed.rerank.loading import load_reranker

__all__ = ["CrossEncoderReranker", "LLMReranker", "Ranked", "Reranker", "load_reranker"]
