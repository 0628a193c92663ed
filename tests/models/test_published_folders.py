"""Published sentence-transformers folders reproduced exactly (or refused): tiny random models saved by
sentence-transformers itself, one per pooling mode x head x normalisation x prompts (pooled or not) x encoder and
left-padded decoder, must give the same vectors through lmembed as through sentence-transformers."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lmembed import Embedder
from lmembed.errors import ConfigError
from lmembed.models.sentence_transformers_folder import PublishedModelError

st = pytest.importorskip("sentence_transformers")
modules = pytest.importorskip("sentence_transformers.sentence_transformer.modules")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WORDS = [
    *("the", "a", "of", "to", "in", "on", "is", "cat", "dog", "sat", "mat", "rug", "man", "woman", "food"),
    *("horse", "riding", "movie", "great", "query", "document", "instruct", "given", "search", "find", "passage"),
    *("hello", "there", "friend", "longer", "text", "science", "protein", "cell", "gene"),
]
TEXTS = [
    "the cat sat on the mat",
    "Hello there friend",
    "a man is riding a horse " * 6,  # longer than max_seq_length
    "protein",
]
MAX_SEQ_LENGTH = 16


def wordpiece_tokenizer():
    """A BERT-style tokenizer ([CLS] text [SEP], lowercasing) over a tiny vocabulary."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {tok: i for i, tok in enumerate(specials + sorted(set(WORDS)) + list(":,.!?"))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )


def bpe_tokenizer(eos: bool):
    """A byte-level BPE tokenizer (tokens merge across the prompt/text boundary), padding on the left; with
    ``eos`` it closes every text with <|endoftext|> as Qwen3-Embedding's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|pad|>"], show_progress=False)
    tok.train_from_iterator([" ".join(WORDS)] * 5 + ["Instruct: find\nQuery: " + " ".join(WORDS)], trainer)
    if eos:
        tok.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>", padding_side="left"
    )


def tiny_backbone(folder: Path, kind: str) -> Path:
    from transformers import BertConfig, BertModel, Qwen2Config, Qwen2Model

    torch.manual_seed(0)
    if kind == "encoder":
        tok = wordpiece_tokenizer()
        model = BertModel(
            BertConfig(
                vocab_size=len(tok),
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=64,
            )
        )
    else:
        tok = bpe_tokenizer(eos=kind == "decoder_eos")
        model = Qwen2Model(
            Qwen2Config(
                vocab_size=len(tok),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
                pad_token_id=tok.pad_token_id,
            )
        )
    backbone = folder / "backbone"
    model.save_pretrained(backbone)
    tok.save_pretrained(backbone)
    return backbone


PROMPTS = {"query": "query: ", "document": "passage: "}
DECODER_PROMPTS = {"query": "Instruct: find the passage\nQuery:", "document": ""}


def save_st_model(
    folder: Path,
    kind: str = "encoder",
    pooling: str = "mean",
    include_prompt: bool = True,
    head: tuple[str, ...] = (),
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
    similarity: str | None = None,
    default_prompt_name: str | None = None,
) -> Path:
    """A tiny sentence-transformers model saved by sentence-transformers itself."""
    backbone = tiny_backbone(folder, kind)
    stack = [
        modules.Transformer(str(backbone), max_seq_length=MAX_SEQ_LENGTH),
        modules.Pooling(32, pooling_mode=pooling, include_prompt=include_prompt),
    ]
    torch.manual_seed(1)
    width = 32
    for layer in head:
        if layer == "dense":
            stack.append(modules.Dense(width, 12, activation_function=torch.nn.Tanh()))
            width = 12
        elif layer == "dense_gelu_nobias":
            stack.append(modules.Dense(width, 16, bias=False, activation_function=torch.nn.GELU()))
            width = 16
        elif layer == "layer_norm":
            norm = modules.LayerNorm(width)
            torch.nn.init.normal_(norm.norm.weight)
            torch.nn.init.normal_(norm.norm.bias)
            stack.append(norm)
    if normalize:
        stack.append(modules.Normalize())
    model = st.SentenceTransformer(
        modules=stack,
        prompts=prompts,
        similarity_fn_name=similarity,
        default_prompt_name=default_prompt_name,
        device="cpu",
    )
    out = folder / "model"
    model.save(str(out))
    shutil.rmtree(backbone)
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def reference(model, kind: str, method: str, texts: list[str], **kwargs) -> np.ndarray:
    """sentence-transformers' vectors; a left-padded decoder one text at a time (sentence-transformers gives a
    padded text other position ids than the same text alone, lmembed the same ones)."""
    batch_size = 1 if kind != "encoder" else 32
    return getattr(model, method)(texts, batch_size=batch_size, **kwargs)


def assert_same(ours: np.ndarray, theirs: np.ndarray, exact: bool) -> None:
    assert ours.shape == theirs.shape
    assert cosines(ours, theirs).min() >= 0.9999
    if exact:  # no normalisation in between: the very vectors
        np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-3)


def load(path: Path, **options) -> Embedder:
    return Embedder.from_pretrained(str(path), cache=False, show_progress=False, **options)


CASES = {
    # name: (kind, pooling, include_prompt, head, normalize, prompts, similarity)
    "cls-dense-normalized-prompt-excluded": ("encoder", "cls", False, ("dense",), True, PROMPTS, None),
    "mean-prompt-pooled-dot": ("encoder", "mean", True, (), False, PROMPTS, "dot"),
    "max-layernorm-prompt-excluded": ("encoder", "max", False, ("layer_norm",), True, PROMPTS, None),
    "mean-sqrt-len-dense-nobias-gelu": (
        "encoder",
        "mean_sqrt_len_tokens",
        True,
        ("dense_gelu_nobias",),
        False,
        PROMPTS,
        "dot",
    ),
    "weightedmean-prompt-excluded": ("encoder", "weightedmean", False, (), True, PROMPTS, None),
    "lasttoken-encoder-no-prompts": ("encoder", "lasttoken", True, ("dense", "layer_norm"), True, None, None),
    "decoder-lasttoken-eos-prompt-pooled": ("decoder_eos", "lasttoken", True, (), True, DECODER_PROMPTS, None),
    "decoder-lasttoken-eos-prompt-excluded-dense": (
        "decoder_eos",
        "lasttoken",
        False,
        ("dense",),
        False,
        DECODER_PROMPTS,
        "dot",
    ),
    "decoder-weightedmean-prompt-excluded": ("decoder", "weightedmean", False, (), True, DECODER_PROMPTS, None),
    "decoder-mean-prompt-excluded-layernorm": ("decoder", "mean", False, ("layer_norm",), True, DECODER_PROMPTS, None),
    "decoder-max-prompt-pooled": ("decoder", "max", True, ("dense_gelu_nobias",), False, DECODER_PROMPTS, "dot"),
    "decoder-cls-mean-sqrt-no-prompts": ("decoder", "mean_sqrt_len_tokens", True, (), False, None, "dot"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_embedder_reproduces_the_published_folder(case, tmp_path):
    kind, pooling, include_prompt, head, normalize, prompts, similarity = CASES[case]
    path = save_st_model(tmp_path, kind, pooling, include_prompt, head, normalize, prompts, similarity)
    theirs = st.SentenceTransformer(str(path), device="cpu")
    ours = load(path)
    exact = normalize or similarity == "dot"  # a cosine model without Normalize is normalised by lmembed
    for method, our_method in (("encode_query", "encode_queries"), ("encode_document", "encode_corpus")):
        assert_same(getattr(ours, our_method)(TEXTS), reference(theirs, kind, method, TEXTS), exact)
    for name in prompts or {}:
        assert_same(
            ours.encode(TEXTS, prompt_name=name), reference(theirs, kind, "encode", TEXTS, prompt_name=name), exact
        )
    assert ours.dim == theirs.get_embedding_dimension()


@pytest.mark.parametrize(
    "case", ["mean-prompt-pooled-dot", "cls-dense-normalized-prompt-excluded", "decoder-max-prompt-pooled"]
)
def test_token_vectors_are_sentence_transformers_token_embeddings(case, tmp_path):
    """``encode_tokens`` gives sentence-transformers' ``output_value="token_embeddings"``: the same tokens (the
    prompt's and the special ones included, whether or not pooling reads them; texts cut at max_seq_length) and the
    same states, before any head or normalisation."""
    kind, pooling, include_prompt, head, normalize, prompts, similarity = CASES[case]
    path = save_st_model(tmp_path, kind, pooling, include_prompt, head, normalize, prompts, similarity)
    theirs = st.SentenceTransformer(str(path), device="cpu")
    ours = load(path)
    pairs = [
        (
            ours.encode_tokens(TEXTS, batch_size=2),
            reference(theirs, kind, "encode", TEXTS, output_value="token_embeddings"),
        ),
        (
            ours.encode_tokens(TEXTS, side="query"),
            reference(theirs, kind, "encode_query", TEXTS, output_value="token_embeddings"),
        ),
        (
            ours.encode_tokens(TEXTS, prompt_name="document"),
            reference(theirs, kind, "encode", TEXTS, prompt_name="document", output_value="token_embeddings"),
        ),
    ]
    for mine, reference_states in pairs:
        assert len(mine) == len(reference_states) == len(TEXTS)
        for row, expected in zip(mine, reference_states, strict=True):
            assert row.dtype == np.float32 and row.shape == tuple(expected.shape)
            np.testing.assert_allclose(row, expected.numpy(), atol=1e-4, rtol=1e-3)
    assert len(pairs[1][0][0]) > len(pairs[0][0][0])  # the query prompt's tokens are there
    with pytest.raises(ConfigError, match="give one"):
        ours.encode_tokens(TEXTS, instruction="x", prompt_name="query")


# ---------------------------------------------------------------------------------------------- one shared folder
@pytest.fixture(scope="module")
def cls_folder(tmp_path_factory):
    """cls pooling, Dense + Normalize, query/document prompts excluded from pooling, a default prompt."""
    folder = tmp_path_factory.mktemp("cls")
    return save_st_model(folder, "encoder", "cls", False, ("dense",), True, {**PROMPTS, "x": "a "}, None, "query")


def test_default_prompt_and_an_unknown_prompt_name(cls_folder):
    theirs = st.SentenceTransformer(str(cls_folder), device="cpu")
    ours = load(cls_folder)
    assert_same(ours.encode(TEXTS), theirs.encode(TEXTS), exact=True)  # default_prompt_name applies
    with pytest.raises(ConfigError, match="prompt_name='nope' is not one of the model's prompts"):
        ours.encode(TEXTS, prompt_name="nope")


def test_an_explicit_option_overrides_the_model_with_one_warning(cls_folder, caplog):
    with caplog.at_level(logging.WARNING, logger="lmembed.embedder"):
        ours = load(cls_folder, pooling="mean")
    assert ours.config.pooling == "mean"
    warned = [r.getMessage() for r in caplog.records if "overrides" in r.getMessage()]
    assert len(warned) == 1
    assert "pooling='mean' (given) overrides the model's own pooling='cls'" in warned[0]
    assert "1_Pooling" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lmembed.embedder"):
        load(cls_folder, pooling="cls")  # the same value: nothing to say
    assert not [r for r in caplog.records if "overrides" in r.getMessage()]


def test_a_saved_published_model_keeps_its_conventions(cls_folder, tmp_path):
    ours = load(cls_folder)
    ours.save(tmp_path / "saved")
    again = load(tmp_path / "saved")
    assert again.config == ours.config
    np.testing.assert_allclose(again.encode_queries(TEXTS), ours.encode_queries(TEXTS), atol=1e-6)
    reloaded = st.SentenceTransformer(str(tmp_path / "saved"), device="cpu")
    assert_same(reloaded.encode_query(TEXTS), ours.encode_queries(TEXTS), exact=True)
    assert_same(reloaded.encode_document(TEXTS), ours.encode_corpus(TEXTS), exact=True)


def test_legacy_files_and_do_lower_case(tmp_path):
    """The pre-v3 layout (sentence_bert_config with max_seq_length/do_lower_case, boolean pooling flags)."""
    path = save_st_model(tmp_path, "decoder", "mean", True, (), True, None, None)
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 12, "do_lower_case": True}))
    flags = {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(flags))
    theirs = st.SentenceTransformer(str(path), device="cpu")
    ours = load(path)
    assert ours.config.max_length == 12 and ours.config.lowercase
    texts = [*TEXTS, "THE CAT Sat"]
    assert_same(ours.encode(texts), reference(theirs, "decoder", "encode", texts), exact=True)


def test_a_transformer_in_its_own_module_folder(tmp_path):
    """Old saves keep the transformer in 0_Transformer/ rather than in the folder itself."""
    path = save_st_model(tmp_path, "encoder", "cls", True, ("dense",), True, PROMPTS, None)
    sub = path / "0_Transformer"
    sub.mkdir()
    for name in (
        "config.json",
        "model.safetensors",
        "sentence_bert_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        (path / name).rename(sub / name)
    break_modules(path, lambda m: [{**m[0], "path": "0_Transformer"}, *m[1:]])
    theirs = st.SentenceTransformer(str(path), device="cpu")
    assert_same(load(path).encode_queries(TEXTS), theirs.encode_query(TEXTS), exact=True)


# ---------------------------------------------------------------------------------------------- refusals
def break_modules(path: Path, edit) -> None:
    entries = json.loads((path / "modules.json").read_text())
    (path / "modules.json").write_text(json.dumps(edit(entries)))


REFUSALS = {
    "unknown module type": (
        lambda p: break_modules(
            p, lambda m: [*m, {"idx": 9, "name": "9", "path": "9_CNN", "type": "sentence_transformers.models.CNN"}]
        ),
        r"module '9' \(sentence_transformers.models.CNN.*not one lmembed can reproduce",
    ),
    "custom code": (
        lambda p: break_modules(p, lambda m: [*m, {"idx": 9, "name": "9", "path": "x", "type": "my_package.Pooler"}]),
        "module '9' is custom code",
    ),
    "malformed modules.json": (
        lambda p: (p / "modules.json").write_text('[{"idx": 0,'),
        r"modules.json: line 1: invalid JSON",
    ),
    "modules.json entry without a type": (
        lambda p: break_modules(p, lambda m: [{"path": ""}]),
        "modules.json: entry 0 must be an object",
    ),
    "unknown pooling flag": (
        lambda p: (p / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "cls", "colour": 1})),
        r"1_Pooling/config.json: unknown pooling flag\(s\) colour",
    ),
    "concatenated pooling modes": (
        lambda p: (p / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": ["cls", "max"]})),
        "are concatenated",
    ),
    "missing Dense weights": (
        lambda p: (p / "2_Dense" / "model.safetensors").unlink(),
        "2_Dense: the weight file is missing",
    ),
    "unknown activation": (
        lambda p: (p / "2_Dense" / "config.json").write_text(
            json.dumps({"in_features": 32, "out_features": 12, "activation_function": "my.Swish"})
        ),
        "activation_function='my.Swish' is unknown",
    ),
    "malformed model config": (
        lambda p: (p / "config_sentence_transformers.json").write_text('{"prompts": '),
        "config_sentence_transformers.json: line 1: invalid JSON",
    ),
    "default prompt that does not exist": (
        lambda p: (p / "config_sentence_transformers.json").write_text(json.dumps({"default_prompt_name": "q"})),
        "default_prompt_name='q' is not one of the prompts",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_lmembed_cannot_reproduce_is_refused_naming_the_file(case, cls_folder, tmp_path):
    path = tmp_path / "model"
    shutil.copytree(cls_folder, path)
    breaker, message = REFUSALS[case]
    breaker(path)
    with pytest.raises(PublishedModelError, match=message):
        load(path)


def test_the_cli_refuses_in_one_line_with_exit_2(cls_folder, tmp_path):
    from typer.testing import CliRunner

    from lmembed.cli.app import app

    path = tmp_path / "model"
    shutil.copytree(cls_folder, path)
    REFUSALS["unknown pooling flag"][0](path)
    (tmp_path / "texts.txt").write_text("the cat\n")
    result = CliRunner().invoke(
        app, ["encode", str(tmp_path / "texts.txt"), "-o", str(tmp_path / "v.npy"), "--model", str(path)]
    )
    assert result.exit_code == 2
    assert "unknown pooling flag(s) colour" in result.output
    assert "Traceback" not in result.output


# ---------------------------------------------------------------------------------------------- asymmetric models
@pytest.mark.parametrize("layout", ["router", "legacy-asym"])
def test_a_router_gives_queries_and_documents_their_own_layers(tmp_path, layout):
    backbone = tiny_backbone(tmp_path, "encoder")
    torch.manual_seed(2)
    router = modules.Router.for_query_document(
        query_modules=[modules.Dense(32, 10, activation_function=torch.nn.Tanh())],
        document_modules=[modules.Dense(32, 10, activation_function=torch.nn.Identity())],
    )
    stack = [
        modules.Transformer(str(backbone), max_seq_length=MAX_SEQ_LENGTH),
        modules.Pooling(32, pooling_mode="mean", include_prompt=False),
        router,
        modules.Normalize(),
    ]
    model = st.SentenceTransformer(modules=stack, prompts=PROMPTS, device="cpu")
    model.save(str(tmp_path / "model"))
    if layout == "legacy-asym":  # the pre-v5 name and file of the same module
        entries = json.loads((tmp_path / "model" / "modules.json").read_text())
        router_dir = tmp_path / "model" / entries[2]["path"]
        (router_dir / "router_config.json").rename(router_dir / "config.json")
        entries[2]["type"] = "sentence_transformers.models.Asym"
        (tmp_path / "model" / "modules.json").write_text(json.dumps(entries))
    theirs = st.SentenceTransformer(str(tmp_path / "model"), device="cpu")
    ours = load(tmp_path / "model")
    assert ours.dim == 10
    assert_same(ours.encode_queries(TEXTS), theirs.encode_query(TEXTS), exact=True)
    assert_same(ours.encode_corpus(TEXTS), theirs.encode_document(TEXTS), exact=True)
    assert_same(ours.encode(TEXTS), theirs.encode(TEXTS), exact=True)  # no task: the default (document) route
    if layout == "router":  # the server reads queries through the query route too
        import httpx

        from lmembed.serving.app import create_app
        from lmembed.serving.server import BackgroundServer

        with BackgroundServer(create_app(ours, model_name="asym")) as server:
            for input_type, method in (("query", "encode_query"), ("document", "encode_document")):
                body = {"model": "asym", "input": TEXTS, "input_type": input_type}
                reply = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
                assert reply.status_code == 200, reply.text
                served = np.array([row["embedding"] for row in reply.json()["data"]], dtype=np.float32)
                assert_same(served, getattr(theirs, method)(TEXTS), exact=True)


# ---------------------------------------------------------------------------------------------- every way in
def test_lmembed_encode_with_a_prompt_name(cls_folder, tmp_path):
    from typer.testing import CliRunner

    from lmembed.cli.app import app

    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    theirs = st.SentenceTransformer(str(cls_folder), device="cpu")
    for extra, expected in (
        (["--prompt-name", "x"], theirs.encode(TEXTS, prompt_name="x")),
        ([], theirs.encode(TEXTS)),
    ):
        out = tmp_path / "v.npy"
        argv = ["encode", str(tmp_path / "texts.txt"), "-o", str(out), "--model", str(cls_folder), "--no-cache", *extra]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        assert_same(np.load(out), expected, exact=True)


def test_index_search_scores_are_the_published_models(cls_folder, tmp_path):
    from lmembed.index import Index

    docs = [(f"d{i}", text) for i, text in enumerate(TEXTS)]
    ours = load(cls_folder)
    index = Index.build(ours, docs, tmp_path / "index")
    theirs = st.SentenceTransformer(str(cls_folder), device="cpu")
    expected = theirs.encode_query(["cat on a mat"]) @ theirs.encode_document(TEXTS).T
    hits = index.search("cat on a mat", k=len(TEXTS))
    assert [h.id for h in hits] == [f"d{i}" for i in np.argsort(-expected[0])]
    np.testing.assert_allclose([h.score for h in hits], np.sort(expected[0])[::-1], atol=1e-4)


def test_the_server_embeds_queries_and_documents_as_the_model_does(cls_folder):
    import httpx

    from lmembed.serving.app import create_app
    from lmembed.serving.server import BackgroundServer

    theirs = st.SentenceTransformer(str(cls_folder), device="cpu")
    app = create_app(load(cls_folder), model_name="published")
    with BackgroundServer(app) as server:
        for input_type, expected in (
            ("query", theirs.encode_query(TEXTS)),
            ("document", theirs.encode_document(TEXTS)),
            (None, theirs.encode(TEXTS)),
        ):
            body = {"model": "published", "input": TEXTS, **({"input_type": input_type} if input_type else {})}
            reply = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
            assert reply.status_code == 200, reply.text
            vectors = np.array([row["embedding"] for row in reply.json()["data"]], dtype=np.float32)
            assert_same(vectors, expected, exact=True)


def test_lmembed_eval_scores_the_published_models_vectors(cls_folder, tmp_path):
    from typer.testing import CliRunner

    from lmembed.cli.app import app
    from lmembed.evaluation.tasks.retrieval import RetrievalTask

    data = tmp_path / "toy"
    (data / "qrels").mkdir(parents=True)
    docs = {f"d{i}": text for i, text in enumerate(TEXTS)}
    queries = {"q1": "cat mat", "q2": "horse riding man", "q3": "protein"}
    qrels = [("q1", "d0"), ("q2", "d2"), ("q3", "d3")]
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in docs.items()))
    (data / "queries.jsonl").write_text("".join(json.dumps({"_id": k, "text": v}) + "\n" for k, v in queries.items()))
    (data / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in qrels)
    )
    out = tmp_path / "results"
    argv = ["eval", "--model", str(cls_folder), "--data", str(data), "-o", str(out), "--no-cache"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    written = json.loads(next(out.rglob("toy.json")).read_text())
    assert written["scores"]["test"][0]["main_score"] > 0
    task = RetrievalTask.from_path(data, name="toy")
    theirs = st.SentenceTransformer(str(cls_folder), device="cpu")
    expected = task.score_embeddings(
        theirs.encode_query(task.data.query_texts), theirs.encode_document(task.data.corpus_texts), model_name="st"
    )
    scores = written["scores"]["test"][0]
    assert scores["main_score"] == pytest.approx(expected.main_score, abs=1e-6)
    assert scores["ndcg_at_1"] == pytest.approx(expected.scores["ndcg_at_1"], abs=1e-6)


def test_training_a_published_model_trains_its_head_and_saves_a_loadable_folder(cls_folder, tmp_path):
    from lmembed.training.train_config import TrainConfig
    from lmembed.training.trainer import Trainer

    rows = [
        {"query": "cat mat", "positive": "the cat sat on the mat", "negatives": ["protein gene cell"]},
        {"query": "horse riding", "positive": "a man is riding a horse", "negatives": ["the dog sat"]},
        {"query": "protein", "positive": "protein cell gene", "negatives": ["a woman food"]},
        {"query": "hello friend", "positive": "hello there friend", "negatives": ["the movie"]},
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    ours = load(cls_folder)
    before = ours.pooling_head.layer_state(0)["linear.weight"].clone()
    options = {"data": [str(data)], "output": str(tmp_path / "run"), "batch_size": 4, "steps": 2, "lr": 5e-3}
    config = TrainConfig(**options, warmup_steps=1, lora=False, progress=False, seed=7)
    result = Trainer(config, model=ours).train()
    trained = load(result.model_dir)
    assert not torch.equal(trained.pooling_head.layer_state(0)["linear.weight"], before)
    reloaded = st.SentenceTransformer(str(result.model_dir), device="cpu")
    assert_same(trained.encode_queries(TEXTS), reloaded.encode_query(TEXTS), exact=True)


def test_a_decoder_saved_with_a_chat_template_is_refused_saying_why(tmp_path):
    """sentence-transformers 6 saves a ``message`` (chat) input beside ``text`` when the tokenizer has a chat template,
    and then embeds a plain string through that template: its vectors are not the plain forward's (checked here, so
    the refusal stays needed), and lmembed, which does not reproduce the template, refuses the folder saying so."""
    from transformers import AutoTokenizer

    backbone = tiny_backbone(tmp_path, "decoder_eos")
    stack = [
        modules.Transformer(str(backbone), max_seq_length=MAX_SEQ_LENGTH),
        modules.Pooling(32, pooling_mode="lasttoken"),
        modules.Normalize(),
    ]
    st.SentenceTransformer(modules=stack, prompts=DECODER_PROMPTS, device="cpu").save(str(tmp_path / "plain"))
    plain = load(tmp_path / "plain").encode_corpus(TEXTS)
    tok = AutoTokenizer.from_pretrained(backbone)
    tok.chat_template = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    tok.save_pretrained(backbone)
    stack[0] = modules.Transformer(str(backbone), max_seq_length=MAX_SEQ_LENGTH)
    st.SentenceTransformer(modules=stack, prompts=DECODER_PROMPTS, device="cpu").save(str(tmp_path / "chat"))
    config = json.loads((tmp_path / "chat" / "sentence_bert_config.json").read_text())
    assert "message" in (config.get("modality_config") or {}), config  # what sentence-transformers 6 writes
    theirs = st.SentenceTransformer(str(tmp_path / "chat"), device="cpu").encode_document(TEXTS)
    assert cosines(plain, theirs).max() < 0.99  # the chat template changed every vector
    with pytest.raises(PublishedModelError, match="wraps every text in the tokenizer's chat template"):
        load(tmp_path / "chat")


def test_a_strategy_without_max_length_reads_the_folders_own_window(tmp_path):
    """``with_config`` and ``encode_strategies`` read a hand-made config's ``max_length=None`` as the engine's
    fallback (512, or the model's positions) where the folder says ``max_seq_length``, under the same strategy
    label: long texts got other vectors than sentence-transformers'."""
    from lmembed import EmbeddingConfig

    path = save_st_model(tmp_path)
    ours = load(path)
    assert ours.config.max_length == MAX_SEQ_LENGTH
    long = [" ".join(TEXTS * 4)]
    expected = ours.encode(long)
    other = ours.with_config(EmbeddingConfig(pooling="mean", normalize=True))
    assert other.config.max_length == MAX_SEQ_LENGTH
    np.testing.assert_allclose(other.encode(long), expected, atol=1e-6)
    (together,) = ours.encode_strategies(long, [EmbeddingConfig(pooling="mean", normalize=True)])
    np.testing.assert_allclose(together, expected, atol=1e-6)
