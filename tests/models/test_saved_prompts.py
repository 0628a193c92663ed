"""A saved folder says sentence-transformers reproduces it only where sentence-transformers gives its query vectors:
the positions a prompt leaves out of pooling must be the same in both."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from family_builders import bpe_tokenizer, family_config, wordpiece_tokenizer
from lmembed import Embedder, EmbeddingConfig
from lmembed.models.sentence_transformers_folder import write_sentence_transformers_files

st = pytest.importorskip("sentence_transformers")

QUERIES = ["what is the cat", "hello friend", "the gene study"]
INSTRUCTION = "find the text"


def _embedder(model_type: str, tokenizer, **strategy) -> Embedder:
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(family_config(model_type, len(tokenizer))).eval()
    config = EmbeddingConfig(query_instruction=INSTRUCTION, **strategy)
    return Embedder.from_model(model, tokenizer, config, use_cache=False, show_progress=False)


def _st_queries(folder) -> np.ndarray:
    model = st.SentenceTransformer(str(folder), device="cpu")
    return model.encode(QUERIES, prompt_name="query", convert_to_numpy=True, normalize_embeddings=True)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_folder_claims_sentence_transformers_only_where_its_query_vectors_are_the_same(tmp_path):
    """A byte-level BPE joins the prompt's closing space to the query's first word: sentence-transformers, which
    leaves out len(tokenize(prompt)) positions, then dropped that word; weighted_mean weighs positions otherwise.
    Both were saved as sentence-transformers folders whose cards promised the same vectors."""
    wordpiece = _embedder("bert", wordpiece_tokenizer(), pooling="mean")
    assert wordpiece.sentence_transformers_compatible()
    folder = wordpiece.save(tmp_path / "bert")
    assert _cosines(_st_queries(folder), wordpiece.encode_queries(QUERIES)).min() >= 0.9999

    for name, emb in {
        "roberta": _embedder("roberta", bpe_tokenizer(), pooling="mean"),
        "bert-weighted": _embedder("bert", wordpiece_tokenizer(), pooling="weighted_mean"),
    }.items():
        assert not emb.sentence_transformers_compatible(), name
        saved = emb.save(tmp_path / name)
        assert not (saved / "modules.json").exists() and "SentenceTransformer(" not in (saved / "README.md").read_text()
        # what the folder would have promised: sentence-transformers' query vectors are not lmembed's
        write_sentence_transformers_files(saved, emb.config, emb.backbone.hidden_size, 64)
        assert _cosines(_st_queries(saved), emb.encode_queries(QUERIES)).min() < 0.999, name
