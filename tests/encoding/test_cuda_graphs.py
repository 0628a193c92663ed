"""The cuda-graphs backend (issue 40): every batch widened to a bucketed shape, whose forward pass is captured once as
a CUDA graph and replayed.

Here (CPU): the buckets (few, small, stable), the widened batches run eagerly (what a replay computes) giving the
torch backend's vectors on decoders in both attention modes, with several layers read, the raw last layer and an
early exit; the refusals (no CUDA device, another dtype, a family it was not checked on, the command line); the
graphs dropped when the weights move. On a GPU (``-m gpu``): replays equal the torch backend and themselves, bit for
bit between calls, pipelined and serial alike, on several threads at once, past ``max_graphs`` and after the weights
move. The encoder families are checked in tests/models/test_family_matrix.py.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import WORDS, tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.encoding.backends import BackendError, make_backend
from lmembed.encoding.backends.cuda_graphs import MIN_WIDTH_STEP, CudaGraphBackend, bucket

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def texts_of(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=k)) for k in rng.integers(1, 60, size=n)]


# ---------------------------------------------------------------------------------------------------- buckets
def test_a_bucket_adds_less_than_an_eighth_and_maps_to_itself():
    previous = 0
    for n in range(1, 5000):
        for step in (1, MIN_WIDTH_STEP):
            b = bucket(n, step)
            assert n <= b < n + max(step, n / 8), (n, step, b)
            assert bucket(b, step) == b  # a batch already at a bucket's shape is not widened again
        assert bucket(n, MIN_WIDTH_STEP) >= previous  # monotone
        previous = bucket(n, MIN_WIDTH_STEP)
    with pytest.raises(ValueError, match="0 rows or tokens"):
        bucket(0)


def test_the_buckets_a_run_meets_stay_few():
    # widths up to 512 tokens: 16 steps of 8 up to 128, then 8 per doubling
    assert len({bucket(w, MIN_WIDTH_STEP) for w in range(1, 513)}) == 32
    # the usual batch sizes are buckets of their own: a full batch is never widened
    assert [bucket(r) for r in (1, 7, 16, 32, 64, 96, 128, 256)] == [1, 7, 16, 32, 64, 96, 128, 256]
    assert bucket(100) == 104 and bucket(13, MIN_WIDTH_STEP) == 16 and bucket(401, MIN_WIDTH_STEP) == 416


def test_a_bucket_never_passes_the_position_table(tokenizer):
    model = tiny_model("bert", len(tokenizer))  # 128 positions
    backend = CudaGraphBackend(Embedder.from_model(model, tokenizer, use_cache=False).backbone, capture=False)
    assert backend.shape_for(3, 121) == (3, 128)
    backend.min_width_step = 100
    assert backend.shape_for(3, 121) == (3, 128) and backend.shape_for(3, 20) == (3, 100)


# ------------------------------------------------------------------------ widened batches: the torch backend's vectors
DECODER_CASES = {
    "llama causal, last token": ("llama", {"attention": "causal", "pooling": "last"}),
    "llama bidirectional, mean": ("llama", {"attention": "bidirectional", "pooling": "mean"}),
    "qwen2 two layers averaged, raw last": ("qwen2", {"pooling": "mean", "layer": [1, -1], "final_norm": False}),
    "qwen2 early exit at layer 1": ("qwen2", {"pooling": "mean", "layer": 1}),
    "gemma3 sliding window": ("gemma3_text", {"attention": "causal", "pooling": "mean"}),
}


@pytest.mark.parametrize("case", DECODER_CASES)
def test_widened_decoder_batches_give_the_torch_backends_vectors(tokenizer, case):
    family, strategy = DECODER_CASES[case]
    model = tiny_model(family, len(tokenizer))
    config = EmbeddingConfig(**strategy)
    plain = Embedder.from_model(model, tokenizer, config, use_cache=False, show_progress=False)
    backbone = plain.backbone
    graphs = CudaGraphBackend(backbone, capture=False, min_row_step=8, min_width_step=32)
    shapes: list[tuple[int, ...]] = []
    states = graphs.eager.states

    def spy(input_ids, attention_mask, configs, mode):
        shapes.append(tuple(input_ids.shape))
        return states(input_ids, attention_mask, configs, mode)

    graphs.eager.states = spy  # type: ignore[method-assign]
    widened = Embedder.from_model(model, tokenizer, config, use_cache=False, show_progress=False, backend=graphs)
    texts = texts_of(21)
    expected = plain.encode(texts, batch_size=5)
    assert widened.backend is graphs and plain.engine.padding_side == "left"  # decoders: padded on the left
    np.testing.assert_allclose(widened.encode(texts, batch_size=5), expected, atol=2e-5)
    assert shapes and all(rows % 8 == 0 and width % 32 == 0 for rows, width in shapes), shapes
    assert graphs.eager_passes == len(shapes) == 5


def test_the_vectors_are_cached_apart_from_the_torch_backends(tokenizer, tmp_path):
    model = tiny_model("llama", len(tokenizer))
    plain = Embedder.from_model(model, tokenizer, cache_dir=tmp_path, show_progress=False)
    graphs = CudaGraphBackend(plain.backbone, capture=False)
    widened = Embedder.from_model(model, tokenizer, cache_dir=tmp_path, show_progress=False, backend=graphs)
    key = widened.engine.cache_model_key(widened.config)
    assert key != plain.engine.cache_model_key(plain.config) and key.endswith("cuda-graphs-float32")


# ---------------------------------------------------------------------------------------------------- refusals
def test_without_a_cuda_device_the_backend_is_refused_by_name(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    with pytest.raises(BackendError, match=r"backend='cuda-graphs' .* needs the model on a CUDA device .* on 'cpu'"):
        Embedder.from_model(model, tokenizer, use_cache=False, backend="cuda-graphs")
    backbone = Embedder.from_model(model, tokenizer, use_cache=False).backbone
    with pytest.raises(BackendError, match=r"at its loaded dtype \(float32\); load it with dtype='float16'"):
        make_backend(backbone, "cuda-graphs", "float16")
    with pytest.raises(BackendError, match=r"runs float models; int8 runs on backend='onnx'"):
        make_backend(backbone, "cuda-graphs", "int8")
    with pytest.raises(BackendError, match="max_graphs=-1"):
        CudaGraphBackend(backbone, capture=False, max_graphs=-1)


def test_a_family_not_checked_on_the_backend_is_refused(tmp_path):
    from family_builders import save_family_folder
    from lmembed.errors import ModelLoadError

    folder = save_family_folder(tmp_path, "convbert")
    backbone = Embedder.from_pretrained(str(folder), cache=False, show_progress=False).backbone
    with pytest.raises(ModelLoadError, match=r"model_type='convbert' is not checked on the cuda-graphs backend"):
        CudaGraphBackend(backbone, capture=False)


def test_the_command_line_refuses_it_on_the_cpu_naming_the_device(tmp_path, tokenizer):
    from lmembed.cli.app import app

    model = tiny_model("bert", len(tokenizer))
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat\na dog\n")
    out = tmp_path / "v.npy"
    args = ["encode", str(texts), "-o", str(out), "--model", str(folder), "--no-cache", "--backend", "cuda-graphs"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and not out.exists()
    assert "cuda-graphs" in result.output and "CUDA device" in result.output, result.output


def test_graphs_are_dropped_when_the_weights_move(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    backbone = Embedder.from_model(model, tokenizer, use_cache=False).backbone
    graphs = CudaGraphBackend(backbone, capture=False)
    config = EmbeddingConfig()
    graphs.prepare([config], "causal")
    graphs.graphs[("a captured shape",)] = object()  # type: ignore[assignment]
    graphs.prepare([config], "causal")  # the same weights: kept
    assert len(graphs.graphs) == 1
    weight = model.layers[0].mlp.up_proj.weight
    weight.data = weight.data.clone()  # new memory: a graph would read the old tensor
    graphs.prepare([config], "causal")
    assert graphs.graphs == {}
    with torch.no_grad():
        weight.add_(1.0)  # changed in place: a replay reads it as it is
    graphs.graphs[("a captured shape",)] = object()  # type: ignore[assignment]
    graphs.prepare([config], "causal")
    assert len(graphs.graphs) == 1


# ------------------------------------------------------------------------ graphs, their replays played on the CPU
class CpuReplays(CudaGraphBackend):
    """A "graph" whose replay runs the recorded pass again over the same fixed buffers and writes its states where the
    first pass left them: what a CUDA graph's replay does, on the CPU. Everything around the capture (buckets, keys,
    buffers, copies out, the lock, max_graphs, moved weights) runs as on a GPU."""

    def __init__(self, backbone, **options):
        super().__init__(backbone, capture=False, **options)
        self.capture = True
        self.recorded = 0

    def _record(self, run):
        self.recorded += 1
        states = run()

        def replay() -> None:
            for kept, fresh in zip(states, run(), strict=True):
                kept.copy_(fresh)

        return replay, states


def _replaying(tokenizer, family: str = "llama", **options):
    model = tiny_model(family, len(tokenizer))
    plain = Embedder.from_model(model, tokenizer, use_cache=False, show_progress=False)
    graphs = CpuReplays(plain.backbone, **options)
    replayed = Embedder.from_model(model, tokenizer, use_cache=False, show_progress=False, backend=graphs)
    return plain, replayed, graphs


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_replays_over_the_fixed_buffers_give_the_torch_backends_vectors(tokenizer, family):
    plain, replayed, graphs = _replaying(tokenizer, family)
    texts = texts_of(70)
    expected = plain.encode(texts, batch_size=16)
    first = replayed.encode(texts, batch_size=16)
    np.testing.assert_allclose(first, expected, atol=2e-5)
    captured = graphs.recorded
    assert captured == len(graphs.graphs) >= 2 and graphs.eager_passes == 0
    # the same shapes again: replayed, nothing recorded, the same vectors bit for bit (pipelined and in series)
    assert np.array_equal(replayed.encode(texts, batch_size=16), first)
    replayed.engine.pipelined = False
    assert np.array_equal(replayed.encode(texts, batch_size=16), first)
    assert graphs.recorded == captured


def test_past_max_graphs_the_shapes_run_eagerly_at_their_buckets_size(tokenizer):
    plain, replayed, graphs = _replaying(tokenizer, max_graphs=2)
    texts = texts_of(70)
    np.testing.assert_allclose(replayed.encode(texts, batch_size=16), plain.encode(texts, batch_size=16), atol=2e-5)
    assert len(graphs.graphs) == 2 and graphs.eager_passes > 0


class SlowReaders(CpuReplays):
    """Returns the states, then waits a little before they are pooled: long enough for another thread to replay the
    same graph, which must not reach them."""

    def states(self, input_ids, attention_mask, configs, mode):
        states = super().states(input_ids, attention_mask, configs, mode)
        time.sleep(0.002)
        return states


def test_engines_on_several_threads_share_the_replays(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    graphs = SlowReaders(Embedder.from_model(model, tokenizer, use_cache=False).backbone)
    replayed = Embedder.from_model(model, tokenizer, use_cache=False, show_progress=False, backend=graphs)
    alone = [replayed.encode(texts, batch_size=8) for texts in TEXT_SETS]
    captured = graphs.recorded
    _each_on_its_own_thread_as_alone(replayed, alone)
    assert graphs.recorded == captured


TEXT_SETS = [texts_of(30, seed) for seed in range(3)]


def _each_on_its_own_thread_as_alone(embedder: Embedder, alone: list[np.ndarray]) -> None:
    """Each of :data:`TEXT_SETS` encoded three times on a thread of its own, all at once: each time the vectors it
    had when encoded alone, bit for bit."""
    together: list[np.ndarray | None] = [None] * len(TEXT_SETS)

    def run(k: int) -> None:
        for _ in range(3):
            together[k] = embedder.encode(TEXT_SETS[k], batch_size=8)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(TEXT_SETS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for k, vectors in enumerate(together):
        assert vectors is not None and np.array_equal(vectors, alone[k]), k


def test_moved_weights_are_captured_again(tokenizer):
    plain, replayed, graphs = _replaying(tokenizer)
    texts = texts_of(20)
    replayed.encode(texts, batch_size=8)
    before = graphs.recorded
    for parameter in plain.backbone.model.parameters():
        parameter.data = parameter.data.clone()
    np.testing.assert_allclose(replayed.encode(texts, batch_size=8), plain.encode(texts, batch_size=8), atol=2e-5)
    assert graphs.recorded == 2 * before


def test_a_forward_pass_that_cannot_be_captured_is_refused_naming_the_model(tokenizer):
    _, replayed, graphs = _replaying(tokenizer)

    def fails(run):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    graphs._record = fails  # type: ignore[method-assign]
    with pytest.raises(BackendError, match=r"model_type='llama' cannot be captured as a CUDA graph .*not permitted"):
        replayed.encode(texts_of(5), batch_size=8)
    assert graphs.graphs == {}


# ---------------------------------------------------------------------------------------------------- on a GPU
def _gpu_embedders(tokenizer, family: str, dtype: torch.dtype, **backend_options):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = tiny_model(family, len(tokenizer)).to("cuda", dtype)
    plain = Embedder.from_model(model, tokenizer, EmbeddingConfig(), use_cache=False, show_progress=False)
    graphs = CudaGraphBackend(plain.backbone, **backend_options)
    replayed = Embedder.from_model(
        model, tokenizer, EmbeddingConfig(), use_cache=False, show_progress=False, backend=graphs
    )
    return plain, replayed, graphs


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("family", "dtype"), [("bert", torch.float32), ("llama", torch.float32), ("llama", torch.float16)]
)
def test_gpu_replays_give_the_torch_backends_vectors_and_their_own_bit_for_bit(tokenizer, family, dtype):
    plain, replayed, graphs = _gpu_embedders(tokenizer, family, dtype)
    texts = texts_of(70)
    expected = plain.encode(texts, batch_size=16)
    first = replayed.encode(texts, batch_size=16)
    captured = len(graphs.graphs)
    assert captured >= 2 and graphs.eager_passes == 0
    assert (first * expected).sum(1).min() >= 0.9999
    if dtype == torch.float32:
        np.testing.assert_allclose(first, expected, atol=1e-5)
    assert np.array_equal(replayed.encode(texts, batch_size=16), first)  # the same graphs: nothing new captured
    assert len(graphs.graphs) == captured
    replayed.engine.pipelined = False
    assert np.array_equal(replayed.encode(texts, batch_size=16), first)  # serial: the same batches and replays


@pytest.mark.gpu
def test_gpu_engines_on_several_threads_share_the_graphs(tokenizer):
    _, replayed, graphs = _gpu_embedders(tokenizer, "llama", torch.float16)
    alone = [replayed.encode(texts, batch_size=8) for texts in TEXT_SETS]
    captured = len(graphs.graphs)
    _each_on_its_own_thread_as_alone(replayed, alone)
    assert len(graphs.graphs) == captured


@pytest.mark.gpu
def test_gpu_past_max_graphs_and_after_the_weights_move(tokenizer):
    plain, replayed, graphs = _gpu_embedders(tokenizer, "bert", torch.float32, max_graphs=2)
    texts = texts_of(70)
    expected = plain.encode(texts, batch_size=16)
    np.testing.assert_allclose(replayed.encode(texts, batch_size=16), expected, atol=1e-5)
    assert len(graphs.graphs) == 2 and graphs.eager_passes > 0
    model = plain.backbone.model
    model.to("cpu").to("cuda")  # every weight in new memory
    before = graphs.eager_passes
    np.testing.assert_allclose(replayed.encode(texts, batch_size=16), expected, atol=1e-5)
    assert len(graphs.graphs) == 2 and graphs.eager_passes > before
