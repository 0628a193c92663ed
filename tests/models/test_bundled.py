"""The bundled real models: they load offline, agree with sentence-transformers, and attend as asked."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import bundled_or_skip
from lmembed import Embedder

pytestmark = pytest.mark.bundled

TEXTS = ["A man is eating food.", "A man is riding a horse.", "The new movie is awesome. " * 60, ""]


@pytest.fixture(scope="module")
def minilm():
    return Embedder.from_pretrained(bundled_or_skip("minilm"), cache=False, show_progress=False)


def test_minilm_matches_sentence_transformers(minilm, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(minilm.backbone.path, device="cpu").encode(TEXTS, normalize_embeddings=True)
    ours = minilm.encode(TEXTS)
    assert minilm.config.max_length == 256  # the model's own limit, as sentence-transformers uses it
    assert minilm.name == "minilm"  # read from its sentence-transformers folder, reported by its bundled name
    assert (ours * reference).sum(1).min() > 0.9999
    # a saved Embedder loads in sentence-transformers with the same vectors
    minilm.save(tmp_path / "m")
    again = st.SentenceTransformer(str(tmp_path / "m"), device="cpu").encode(TEXTS)
    assert (ours * again).sum(1).min() > 0.9999


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_decoder_bidirectional_and_causal(name):
    emb = Embedder.from_pretrained(
        bundled_or_skip(name), pooling="cls", attention="bidirectional", normalize=False, cache=False
    )
    pair = ["The cat sat on the mat", "The cat sat on the rug"]
    bidir = emb.encode(pair)
    causal = emb.with_config(emb.config.with_options(attention="causal")).encode(pair)
    assert np.abs(bidir[0] - bidir[1]).max() > 1e-2
    assert np.abs(causal[0] - causal[1]).max() < 1e-5
    # and the bidirectional vector of a text is the same alone and in a padded batch
    alone = emb.encode(pair[:1], batch_size=1)
    batch = emb.encode([pair[0], "a considerably longer sentence so that the first one is padded"], batch_size=2)
    np.testing.assert_allclose(batch[0], alone[0], rtol=1e-4, atol=1e-4)
