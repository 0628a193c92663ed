"""The architecture matrix: every encoder family in :data:`lmembed.models.families.ENCODER_FAMILIES`, built tiny
and saved by sentence-transformers itself, gives sentence-transformers' vectors through lmembed on every backend
the registry lists for it (torch, ONNX float32 at cosine >= 0.9999 per text, int8 at the int8 quality gate's
threshold) with padded batches, on either padding side; a family or a backend outside the registry is refused.

Before the registry, the torch backend gave every model positions 0, 1, 2 ...: RoBERTa, XLM-R, CamemBERT,
XLM-R-XL, data2vec-text and RoBERTa-PreLayerNorm (positions from ``padding_idx + 1``) came out at min cosine
0.81-0.89 to sentence-transformers here, MPNet at 0.19.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from lmembed import Embedder
from lmembed.encoding.backends import quality
from lmembed.encoding.backends.base import AFTER_PADDING_TAG
from lmembed.encoding.cache import model_key
from lmembed.errors import ModelLoadError
from lmembed.models.families import (
    AFTER_PADDING,
    COUNTED,
    ENCODER_FAMILIES,
    OWN,
    position_ids,
)

st = pytest.importorskip("sentence_transformers")

from family_builders import save_family_folder, wordpiece_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Texts of very different lengths in one padded batch: 3 tokens ([CLS] dog [SEP]) up to the 40-token truncation.
TEXTS = [
    "dog",
    "the cat sat on the mat",
    "Hello there, friend!",
    " ".join(["a man is riding a horse"] * 8),
    "protein folding in the cell of a study",
    "a",
    "gene expression",
    "science result text",
    "longer text of the movie",
    "food on the rug",
    " ",  # a byte-level BPE tokenises it to a prefix space "Ġ" of no text of its own: pooled, as the reference does
    "\t the dog",
    "猫 the cat",
]
EXACT = 0.9999
#: Families whose sentence-transformers folder lmembed cannot load itself: their model is wrapped instead.
FAMILIES = sorted(ENCODER_FAMILIES)


#: int8 legs of the default run (one family per position convention and tokenizer kind); the others run with
#: ``-m slow`` (each int8 leg exports, calibrates and quantises a graph: about a second).
DEFAULT_INT8 = {"bert", "roberta", "xlm-roberta", "mpnet", "distilbert", "modernbert", "t5"}


def _on(backend: str) -> list:
    """The registry's families checked on ``backend``."""
    families = [f for f in FAMILIES if backend in ENCODER_FAMILIES[f].backends]
    if backend != "int8":
        return families
    return [pytest.param(f, marks=() if f in DEFAULT_INT8 else (pytest.mark.slow,), id=f) for f in families]


class Built:
    """Each family's folder and sentence-transformers' vectors of :data:`TEXTS`, built once per module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[str, tuple[Path, np.ndarray]] = {}
        self.models: dict[str, object] = {}

    def __call__(self, model_type: str) -> tuple[Path, np.ndarray]:
        if model_type not in self.cache:
            folder = save_family_folder(self.root, model_type)
            model = st.SentenceTransformer(str(folder), device="cpu")
            self.models[model_type] = model
            self.cache[model_type] = folder, model.encode(TEXTS, batch_size=len(TEXTS))  # one padded batch
        return self.cache[model_type]

    def embedder(self, model_type: str, **options) -> Embedder:
        """lmembed's Embedder of the family's folder (a T5 folder loads its encoder, as sentence-transformers does)."""
        folder, _ = self(model_type)
        return Embedder.from_pretrained(str(folder), cache=False, show_progress=False, **options)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    return Built(tmp_path_factory.mktemp("families"))


@pytest.fixture(autouse=True)
def _isolated_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def encode(built: Built, model_type: str, padding_side: str | None = None, **options) -> np.ndarray:
    emb = built.embedder(model_type, **options)
    if padding_side:
        emb.engine.padding_side = padding_side
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a tiny random model may or may not pass int8's gate
        vectors = emb.encode(TEXTS, batch_size=len(TEXTS))
    assert emb.backend.name == options.get("backend", "onnx" if options.get("precision") == "int8" else "torch")
    return vectors


@pytest.mark.parametrize("model_type", FAMILIES)
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_torch_gives_sentence_transformers_vectors(built, model_type, padding_side):
    if padding_side == "left" and ENCODER_FAMILIES[model_type].positions == OWN:
        pytest.skip(f"{model_type} numbers its positions itself: lmembed pads it on the right")
    _, reference = built(model_type)
    ours = encode(built, model_type, padding_side)
    assert cosines(ours, reference).min() >= EXACT, cosines(ours, reference)


@pytest.mark.parametrize("model_type", _on("onnx"))
def test_onnx_gives_sentence_transformers_vectors(built, model_type):
    _, reference = built(model_type)
    assert cosines(encode(built, model_type, backend="onnx"), reference).min() >= EXACT


@pytest.mark.parametrize("model_type", _on("cuda-graphs"))
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_cuda_graph_buckets_give_sentence_transformers_vectors(built, model_type, padding_side):
    """The cuda-graphs backend widens every batch to a bucket (here 16 rows and 64 tokens: the ten texts are 3 to
    40 tokens long) with masked padding on the right; run eagerly at that shape (what a replay computes: no GPU
    here), each family's vectors stay sentence-transformers' and the torch backend's."""
    if padding_side == "left" and ENCODER_FAMILIES[model_type].positions == OWN:
        pytest.skip(f"{model_type} numbers its positions itself: lmembed pads it on the right")
    from lmembed.encoding.backends.cuda_graphs import CudaGraphBackend

    _, reference = built(model_type)
    emb = built.embedder(model_type)
    emb.engine.padding_side = padding_side
    plain = emb.encode(TEXTS, batch_size=len(TEXTS))
    graphs = CudaGraphBackend(emb.backbone, capture=False, min_row_step=16, min_width_step=64)
    emb.engine.backend = graphs
    widened = emb.encode(TEXTS, batch_size=len(TEXTS))
    assert graphs.eager_passes == 1
    assert cosines(widened, reference).min() >= EXACT
    np.testing.assert_allclose(widened, plain, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", _on("cuda-graphs"))
def test_gpu_cuda_graphs_capture_every_family_and_give_sentence_transformers_vectors(built, model_type):
    """On a GPU, each family's forward pass is captured and replayed (float32): nothing in it reads device values on
    the host, and the replays give sentence-transformers' vectors."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _, reference = built(model_type)
    emb = built.embedder(model_type, device="cuda", backend="cuda-graphs")
    vectors = emb.encode(TEXTS, batch_size=4)
    assert emb.backend.name == "cuda-graphs" and len(emb.backend.graphs) >= 2
    assert cosines(vectors, reference).min() >= EXACT


@pytest.mark.xfail(
    strict=True,
    reason="ONNX Runtime's fused Attention takes ReduceSum(attention_mask) as each row's key length, which assumes "
    "right padding: a left-padded encoder row attends to its padding and misses its last tokens (lmembed pads "
    "encoders on the right; only a caller that sets padding_side='left', as `lmembed doctor` does, meets this)",
)
def test_onnx_left_padding_gives_the_right_padded_vectors(built):
    left, right = encode(built, "bert", "left", backend="onnx"), encode(built, "bert", backend="onnx")
    np.testing.assert_allclose(left, right, atol=1e-4)


@pytest.mark.parametrize("model_type", _on("int8"))
def test_int8_stays_within_the_quality_gate_of_sentence_transformers(built, model_type):
    _, reference = built(model_type)
    assert cosines(encode(built, model_type, precision="int8", threads=1), reference).min() >= quality.MIN_COSINE


@pytest.mark.parametrize("model_type", ["roberta", "mpnet"])
def test_torch_dynamic_int8_numbers_positions_the_same_way(built, model_type):
    _, reference = built(model_type)
    ours = encode(built, model_type, backend="torch", precision="int8")
    assert cosines(ours, reference).min() >= quality.MIN_COSINE


def test_torch_dynamic_int8_is_gated_against_the_float_model_it_was_made_from(built):
    """torch's dynamic int8 had no gate (minilm read at min cosine 0.96 to float32 without a word): it is measured at
    load on GATE_TEXTS against the float model it was quantised from, reported, and the float model dropped."""
    int8 = built.embedder("roberta", backend="torch", precision="int8")
    (report,) = int8.backend.quality.values()
    assert int8.backend.describe()["quality_gate"][int8.config.label()]["texts"] == len(quality.GATE_TEXTS)
    assert int8.backbone.float_reference is None
    texts = list(quality.GATE_TEXTS)
    expected = quality.gate(built.embedder("roberta").encode(texts), int8.encode(texts))
    assert report == expected and report.min_cosine < 1.0


def test_torch_dynamic_int8_refuses_a_model_it_would_barely_quantise(built):
    """I-BERT's QuantLinear layers are not nn.Linear: one Linear layer of 13 was quantised, and it ran as float32
    labelled int8 (vectors bit-identical to float32)."""
    with pytest.raises(ModelLoadError, match=r"model_type='ibert' keeps 9\d% of its weight matrices in layers"):
        built.embedder("ibert", backend="torch", precision="int8")


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_family_that_reads_padding_gives_each_text_its_vector_alone(built, backend):
    """ConvBERT's span convolutions read the padding beside a text whatever the mask says: its vectors depended on
    the batch (min cosine 0.990 between batch sizes 1 and 7). It is batched one length at a time, never padded."""
    from lmembed.encoding.engine import plan_batches

    emb = built.embedder("convbert", backend=backend)
    assert emb.engine.unpadded and not built.embedder("bert").engine.unpadded
    batched = emb.encode(TEXTS, batch_size=len(TEXTS))
    alone = np.stack([emb.encode([text])[0] for text in TEXTS])
    np.testing.assert_allclose(batched, alone, atol=1e-6)
    assert plan_batches([5, 3, 5, 3, 4], 8, unpadded=True) == [[0, 2], [4], [1, 3]]


def test_positions_follow_each_convention():
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    assert position_ids(COUNTED, right).tolist() == [[0, 1, 2, 2], [0, 1, 2, 3]]
    assert position_ids(COUNTED, left).tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]
    # fairseq: padding_idx on padding, padding_idx + 1 on: transformers' RoBERTa numbering of a right-padded row
    assert position_ids(AFTER_PADDING, right, padding_idx=1).tolist() == [[2, 3, 4, 1], [2, 3, 4, 5]]
    assert position_ids(AFTER_PADDING, left, padding_idx=1).tolist() == [[1, 2, 3, 4], [2, 3, 4, 5]]
    assert position_ids(OWN, right) is None
    with pytest.raises(ModelLoadError, match="pad_token_id"):
        position_ids(AFTER_PADDING, right)


def _tiny(config_class, **extra):
    from transformers import AutoModel

    tok = wordpiece_tokenizer()
    torch.manual_seed(0)
    size = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 37}
    return AutoModel.from_config(config_class(**size, vocab_size=len(tok), **extra)).eval(), tok


def test_an_encoder_family_outside_the_matrix_is_refused():
    from transformers import XLMConfig, XLMModel

    tok = wordpiece_tokenizer()
    torch.manual_seed(0)
    model = XLMModel(XLMConfig(vocab_size=len(tok), emb_dim=32, n_layers=2, n_heads=2, pad_index=0)).eval()
    with pytest.raises(ModelLoadError, match=r"model_type='xlm' .* not checked .* families are: albert, bert"):
        Embedder.from_model(model, tok, use_cache=False, show_progress=False)


@pytest.mark.parametrize(("model_type", "backend"), [("deberta-v2", "int8"), ("gemma3_text", "onnx")])
def test_a_backend_outside_the_matrix_is_refused(model_type, backend):
    from transformers import DebertaV2Config, Gemma3TextConfig

    if model_type == "deberta-v2":
        model, tok = _tiny(DebertaV2Config, relative_attention=True, position_biased_input=False)
    else:
        model, tok = _tiny(Gemma3TextConfig, head_dim=16, num_key_value_heads=1, use_bidirectional_attention=True)
    supported = ", ".join(ENCODER_FAMILIES[model_type].backends)
    assert backend not in supported
    options = {"precision": "int8"} if backend == "int8" else {"backend": backend}
    message = rf"model_type='{model_type}' is not checked on the {backend} backend .*; it runs on: {supported}$"
    with pytest.raises(ModelLoadError, match=message):
        Embedder.from_model(model, tok, use_cache=False, show_progress=False, **options)
    Embedder.from_model(model, tok, use_cache=False, show_progress=False)  # torch is checked: accepted


def test_a_t5_folder_loads_its_encoder_as_sentence_transformers_does(built):
    folder, expected = built("t5")
    emb = Embedder.from_pretrained(str(folder), cache=False, show_progress=False)
    assert type(emb.backbone.model).__name__ == "T5EncoderModel"
    assert cosines(emb.encode(TEXTS, batch_size=len(TEXTS)), expected).min() >= 0.9999


@pytest.mark.parametrize(("model_type", "tagged"), [("roberta", True), ("mpnet", True), ("bert", False)])
def test_vectors_cached_with_the_old_positions_are_not_served(built, model_type, tagged):
    """lmembed gave RoBERTa-style families positions from 0 before: their torch vectors are cached under a new key,
    so an embedding cache filled then cannot serve them; families whose vectors did not change keep their key."""
    emb = built.embedder(model_type)
    key = emb.engine.cache_model_key(emb.config)
    assert key == model_key(emb.backbone.fingerprint(), AFTER_PADDING_TAG if tagged else "")
