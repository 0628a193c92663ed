"""lmembed.index: corpus readers, the four kinds, the persisted folder (build, reopen, add, search), the
manifest check, resuming a killed build from the cache, the CLI, and flat search against `lmembed eval`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import REPO, WORDS, bundled_or_skip, shared_or_skip, tiny_model
from helpers import write_jsonl
from lmembed import Embedder, EmbeddingConfig
from lmembed.cli.app import app
from lmembed.errors import LmembedError
from lmembed.index import (
    Document,
    DuplicateIdError,
    Index,
    IndexFormatError,
    IndexMismatchError,
    IndexParams,
    load_corpus,
    load_queries,
)
from lmembed.index.manifest import MANIFEST_FILE, Manifest
from lmembed.io import DataFormatError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_texts(n: int, seed: int, lo: int = 3, hi: int = 14) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(lo, hi))) for _ in range(n)]


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    texts = random_texts(60, seed=1)
    rows = [{"_id": f"d{i}", "title": "doc" if i % 2 else "", "text": t, "year": 2000 + i} for i, t in enumerate(texts)]
    return write_jsonl(tmp_path / "corpus.jsonl", rows)


@pytest.fixture
def bert(make_embedder) -> Embedder:
    return make_embedder("bert")


# ---------------------------------------------------------------------------------------------- corpus
def test_corpus_formats(tmp_path):
    rows = [
        {"_id": "a", "title": "T", "text": " body ", "lang": "en"},
        {"id": 7, "text": "seven"},
        {"_id": "c", "title": "only a title"},
    ]
    docs = load_corpus(write_jsonl(tmp_path / "c.jsonl", rows))
    assert docs == [
        Document("a", "T  body", {"title": "T", "lang": "en"}),
        Document("7", "seven", {}),
        Document("c", "only a title", {"title": "only a title"}),
    ]
    (tmp_path / "lines.txt").write_text("first doc\n\n  second doc  \n")
    assert load_corpus(tmp_path / "lines.txt") == [Document("1", "first doc"), Document("3", "second doc")]
    beir = tmp_path / "beir"
    beir.mkdir()
    write_jsonl(beir / "corpus.jsonl", rows[:2])
    write_jsonl(beir / "queries.jsonl", [{"_id": "q1", "text": " what? "}])
    assert [d.id for d in load_corpus(beir)] == ["a", "7"]
    assert load_queries(beir) == [("q1", " what? ")]  # queries are kept as given, as eval reads them

    dup = write_jsonl(
        tmp_path / "dup.jsonl", [{"_id": "x", "text": "a"}, {"_id": "y", "text": "b"}, {"_id": "x", "text": "c"}]
    )
    with pytest.raises(DuplicateIdError, match=r"dup.jsonl:3: duplicate id 'x' \(first at line 1\)"):
        load_corpus(dup)
    with pytest.raises(DataFormatError, match=r"noid.jsonl:1: missing id field"):
        load_corpus(write_jsonl(tmp_path / "noid.jsonl", [{"text": "a"}]))
    with pytest.raises(DataFormatError, match=r"notext.jsonl:1: missing field 'text'"):
        load_corpus(write_jsonl(tmp_path / "notext.jsonl", [{"_id": "a", "body": "x"}]))
    with pytest.raises(FileNotFoundError):
        load_corpus(tmp_path / "absent.jsonl")


# ---------------------------------------------------------------------------------------------- kinds
KINDS = [
    pytest.param({"kind": "flat"}, id="flat"),
    pytest.param({"kind": "hnsw", "hnsw_m": 8}, id="hnsw"),
    pytest.param({"kind": "ivf-pq", "nlist": 2, "pq_m": 4}, id="ivf-pq"),
    pytest.param({"kind": "binary", "rescore": "float"}, id="binary-float"),
    pytest.param({"kind": "binary", "rescore": "int8"}, id="binary-int8"),
]


@pytest.mark.parametrize("params", KINDS)
def test_build_reopen_add_search(make_embedder, corpus_file, tmp_path, params):
    emb = make_embedder("llama", pooling="last")
    folder = tmp_path / "index"
    built = Index.build(emb, corpus_file, folder, chunk_size=16, **params)
    assert (built.count, built.dim, built.kind) == (60, 32, params["kind"])
    queries = random_texts(5, seed=2)

    reopened = Index.open(folder, emb)
    assert reopened.manifest.params == built.manifest.params
    for a, b in zip(built.search_batch(queries, k=7), reopened.search_batch(queries, k=7), strict=True):
        assert [(h.id, h.score) for h in a] == [(h.id, h.score) for h in b]

    docs = load_corpus(corpus_file)
    doc_vectors = emb.encode_corpus([d.text for d in docs])
    query_vectors = emb.encode_queries(queries)
    exact = query_vectors @ doc_vectors.T
    for qi, hits in enumerate(reopened.search_batch(queries, k=7)):
        assert [h.rank for h in hits] == list(range(1, 8))
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        rows = [int(h.id[1:]) for h in hits]
        assert hits[0].metadata["year"] == 2000 + rows[0] and hits[0].text == docs[rows[0]].text
        if params["kind"] in ("flat", "hnsw"):  # exact on a corpus this small
            expected = np.argsort(-exact[qi], kind="stable")[:7]
            assert rows == expected.tolist()
            np.testing.assert_allclose(scores, exact[qi, expected], atol=1e-5)
        elif params["kind"] == "binary":  # candidates by Hamming distance, scores by rescoring
            tolerance = 1e-5 if params["rescore"] == "float" else 0.02
            np.testing.assert_allclose(scores, exact[qi, rows], atol=tolerance)

    added = ["the man riding a horse to the science study", "gene protein retrieval vector model"]
    assert reopened.add([Document("new1", added[0], {"src": "add"}), Document("new2", added[1])]) == 2
    again = Index.open(folder, emb)
    assert again.count == 62 and again.manifest.generation == 2
    kept = {*again.manifest.files.values(), *built.manifest.files.values()}  # the previous generation stays too
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("g")) == sorted(kept)
    if params["kind"] != "ivf-pq":  # a document's own text finds it first (ivf-pq codes are lossy)
        top = again.search(added[0], k=3)[0]
        assert (top.id, top.metadata) == ("new1", {"src": "add"})
        assert top.score == pytest.approx(1.0, abs=1e-4 if params.get("rescore") != "int8" else 0.02)


@pytest.mark.parametrize("params", [*KINDS, pytest.param({"kind": "binary", "rescore": "none"}, id="binary-none")])
def test_a_build_adds_each_chunk_as_encoded_where_its_kind_allows(make_embedder, corpus_file, monkeypatch, params):
    """A build held the corpus's vectors three times at its peak (gathered, normalised copy, the index's own);
    a kind that takes vectors a part at a time now gets each chunk as it is encoded (bench/index_build_memory.py),
    and the index holds the vectors a one-chunk build holds, bit for bit."""
    from lmembed.index import kinds

    emb = make_embedder("llama", pooling="last")
    calls = []
    for cls in (kinds.FaissIndex, kinds.BinaryIndex):
        real = cls.add
        monkeypatch.setattr(
            cls, "add", lambda self, v, *, own=False, real=real: (calls.append(len(v)), real(self, v, own=own))[1]
        )
    chunked = Index.build(emb, corpus_file, chunk_size=16, **params)
    streams = params["kind"] == "flat" or params.get("rescore") == "none"
    assert calls == ([16, 16, 16, 12] if streams else [60])
    whole = Index.build(emb, corpus_file, chunk_size=1000, **params)
    # the same index whatever the chunk size: its files byte for byte (an HNSW graph built in parts was another;
    # FAISS's threads may order one graph's links otherwise, so hnsw is held to its results)
    for index in (chunked, whole):
        index.save(corpus_file.parent / f"saved-{id(index)}")
    for (_, a), (_, b) in zip(*(sorted(i.manifest.files.items()) for i in (chunked, whole)), strict=True):
        one, two = (corpus_file.parent / f"saved-{id(i)}" / f for i, f in ((chunked, a), (whole, b)))
        assert params["kind"] == "hnsw" or one.read_bytes() == two.read_bytes(), a
    queries = random_texts(5, seed=3)
    assert [[h.id for h in r] for r in chunked.search_batch(queries, k=9)] == [
        [h.id for h in r] for r in whole.search_batch(queries, k=9)
    ]


def test_build_refuses_a_parameter_its_kind_does_not_read_and_search_names_its_keywords(bert, corpus_file):
    """``Index.build(kind="flat", nlist=3)`` built a flat index as if ``nlist`` meant something, and a misspelt
    parameter was a TypeError from a dataclass the user never called; both are refused before anything is
    encoded, with the names the kind reads. ``search`` spelt its keywords as ``**how``: a misspelt one was
    reported as ``search_rows()``'s."""
    from lmembed.errors import ConfigError

    with pytest.raises(ConfigError, match=r"nlist is a parameter of ivf-pq indexes: a flat index does not read it"):
        Index.build(bert, corpus_file, kind="flat", nlist=3)
    with pytest.raises(ConfigError, match=r"'hnsw_mm' \(did you mean 'hnsw_m'\?\); a hnsw index reads: hnsw_m, "):
        Index.build(bert, corpus_file, kind="hnsw", hnsw_mm=8)
    index = Index.build(bert, corpus_file, kind="hnsw", hnsw_m=8)
    assert index.manifest.params.hnsw_m == 8
    with pytest.raises(TypeError, match=r"Index\.search\(\) got an unexpected keyword argument 'modee'"):
        index.search("cat", 2, modee="bm25")  # type: ignore[call-arg]
    assert [h.rank for h in index.search("cat", 2, mode="hybrid", candidates=3)] == [1, 2]


def test_duplicate_ids_are_refused_and_change_nothing(bert, corpus_file, tmp_path):
    with pytest.raises(DuplicateIdError, match="given twice"):
        Index.build(bert, [("a", "one"), ("b", "two"), ("a", "three")])
    folder = tmp_path / "index"
    index = Index.build(bert, corpus_file, folder)
    before = (folder / MANIFEST_FILE).read_text()
    with pytest.raises(DuplicateIdError, match=r"1 document id\(s\) already in the index or given twice: d3"):
        index.add([Document("fresh", "text"), Document("d3", "again")])
    with pytest.raises(DuplicateIdError, match="fresh"):
        index.add([Document("fresh", "text"), Document("fresh", "text 2")])
    assert (folder / MANIFEST_FILE).read_text() == before
    assert Index.open(folder, bert).count == index.count == 60


def test_manifest_refuses_another_strategy_or_model(make_embedder, tokenizer, corpus_file, tmp_path):
    emb = make_embedder("llama", pooling="mean")
    folder = tmp_path / "index"
    Index.build(emb, corpus_file, folder, dim=16)
    manifest = Manifest.read(folder)
    assert manifest.dim == 16 and manifest.strategy["dim"] == 16 and manifest.strategy["pooling"] == "mean"
    assert manifest.model.fingerprint == emb.backbone.fingerprint() and manifest.model.load.source is None

    with pytest.raises(IndexMismatchError, match=r"dim: index=16 embedder=None"):
        Index.open(folder, emb)  # the same model, but queries would not be truncated to 16 dimensions
    matryoshka = emb.with_config(emb.config.with_options(dim=16))
    index = Index.open(folder, matryoshka)
    assert index.embed_queries(["the cat"]).shape == (1, 16)
    with pytest.raises(IndexMismatchError, match=r"pooling: index='mean' embedder='last'"):
        Index.open(folder, matryoshka.with_config(matryoshka.config.with_options(pooling="last")))
    other = Embedder.from_model(tiny_model("llama", len(tokenizer), seed=1), tokenizer, matryoshka.config)
    with pytest.raises(IndexMismatchError, match=r"model \(weights, config and tokenizer\): index=in-memory"):
        Index.open(folder, other)
    with pytest.raises(ValueError, match="no Embedder"):
        Index.open(folder).search("query")
    with pytest.raises(IndexFormatError, match="in-memory model"):
        Index.open(folder).load_embedder()


def test_index_reloads_its_own_model_and_notices_a_changed_one(make_embedder, tokenizer, corpus_file, tmp_path):
    model_dir = tmp_path / "model"
    emb = make_embedder("bert")
    emb.save(model_dir)
    saved = Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)
    folder = tmp_path / "index"
    built = Index.build(saved, corpus_file, folder, kind="hnsw")
    index = Index.open(folder)
    assert index.manifest.model.load.source == str(model_dir.resolve())
    index.load_embedder()
    assert [h.id for h in index.search("the cat sat", k=5)] == [h.id for h in built.search("the cat sat", k=5)]

    retrained = Embedder.from_model(tiny_model("bert", len(tokenizer), seed=3), tokenizer, EmbeddingConfig())
    retrained.save(model_dir)  # the model folder changed after the build
    with pytest.raises(IndexMismatchError, match="weights"):
        Index.open(folder).load_embedder()


def test_folder_safety(bert, corpus_file, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="other files"):
        Index.build(bert, corpus_file, other)
    folder = tmp_path / "index"
    Index.build(bert, ["one", "two"], folder)
    with pytest.raises(FileExistsError, match="already holds an index") as refused:
        Index.build(bert, corpus_file, folder)
    assert isinstance(refused.value, LmembedError)  # a caller catching lmembed's errors catches it too
    assert Index.build(bert, corpus_file, folder, overwrite=True).count == 60
    assert Index.open(folder, bert).count == 60

    first, second = Index.open(folder, bert), Index.open(folder, bert)
    first.add(["an added text"])
    with pytest.raises(IndexFormatError, match="changed by another writer"):
        second.add(["another added text"])
    assert Index.open(folder, bert).count == 61

    with pytest.raises(IndexFormatError, match="not an lmembed index"):
        Index.open(other)
    (folder / MANIFEST_FILE).write_text("{broken")
    with pytest.raises(IndexFormatError, match="invalid JSON in the index manifest"):
        Index.open(folder)
    with pytest.raises(ValueError, match="multiple of 8"):
        Index.build(bert, ["a"], kind="binary", dim=12)
    with pytest.raises(ValueError, match="unknown"):
        Index.build(bert, ["a"], kind="annoy")


KILLED_BUILD = """
import sys, time
from lmembed import Embedder
from lmembed.index import Index

emb = Embedder.from_pretrained(sys.argv[1], cache_dir=sys.argv[2], show_progress=False)

def progress(done, total):
    print(done, flush=True)
    if done >= 16:
        time.sleep(600)  # killed here, half-way

Index.build(emb, sys.argv[3], sys.argv[4], chunk_size=8, progress=progress)
"""


def test_killed_build_resumes_from_the_cache(make_embedder, corpus_file, tmp_path):
    """A build killed (SIGKILL) after two chunks leaves no index; the re-run encodes only the rest."""
    model_dir, cache_dir, folder = tmp_path / "model", tmp_path / "cache", tmp_path / "index"
    make_embedder("qwen2", pooling="last").save(model_dir)
    script = tmp_path / "build.py"
    script.write_text(textwrap.dedent(KILLED_BUILD))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    args = [sys.executable, str(script), str(model_dir), str(cache_dir), str(corpus_file), str(folder)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(2)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert lines == ["8", "16"]
    assert not (folder / MANIFEST_FILE).exists()

    emb = Embedder.from_pretrained(str(model_dir), cache_dir=cache_dir, show_progress=False)
    emb.encode(["warm up"])  # the decoder's one-off attention check runs a pass of its own; not counted
    computed = []
    hook = emb.backbone.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: computed.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    index = Index.build(emb, corpus_file, folder, chunk_size=8)
    hook.remove()
    assert sum(computed) == 60 - 16  # the two finished chunks came from the cache
    uncached = Embedder.from_pretrained(str(model_dir), cache=False, show_progress=False)
    fresh = Index.build(uncached, corpus_file)
    for a, b in zip(index.search_batch(["the cat sat"], 5)[0], fresh.search_batch(["the cat sat"], 5)[0], strict=True):
        assert a.id == b.id and a.score == pytest.approx(b.score, abs=1e-6)


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_build_info_search(make_embedder, corpus_file, tmp_path):
    import pytrec_eval

    model_dir, folder = tmp_path / "model", tmp_path / "index"
    make_embedder("bert").save(model_dir)
    runner = CliRunner()
    args = ["index", "build", str(corpus_file), "-o", str(folder), "--model", str(model_dir), "--kind", "binary"]
    result = runner.invoke(app, [*args, "--rescore", "int8", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert "indexed 60 documents (binary, dim 32" in result.output

    result = runner.invoke(app, ["index", "info", str(folder), "--json"])
    info = json.loads(result.output)
    assert info["count"] == 60 and info["params"] == {"kind": "binary", "rescore": "int8", "rescore_multiplier": 4}
    assert info["memory_bytes"] == 60 * 32 // 8  # the bits only: the int8 rescoring vectors stay on disk
    assert runner.invoke(app, ["index", "info", str(folder)]).exit_code == 0

    result = runner.invoke(app, ["search", str(folder), "the cat sat on the mat", "-k", "3"])
    assert result.exit_code == 0, result.output
    rows = re.findall(r"^│\s+(\d+)\s+│\s+([\d.]+)\s+│\s+(d\d+)\s+│", result.output, flags=re.MULTILINE)
    assert [rank for rank, _, _ in rows] == ["1", "2", "3"], result.output

    queries = write_jsonl(tmp_path / "queries.jsonl", [{"_id": "q1", "text": "cat"}, {"_id": "q2", "text": "gene"}])
    run_file = tmp_path / "run.jsonl"
    result = runner.invoke(app, ["search", str(folder), "--queries", str(queries), "-o", str(run_file), "-k", "4"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in run_file.read_text().splitlines()]
    assert [r["query_id"] for r in rows] == ["q1", "q2"] and all(len(r["hits"]) == 4 for r in rows)
    with run_file.with_suffix(".trec").open() as handle:
        trec = pytrec_eval.parse_run(handle)
    assert trec == {r["query_id"]: {h["id"]: pytest.approx(h["score"], abs=1e-6) for h in r["hits"]} for r in rows}

    added = write_jsonl(tmp_path / "more.jsonl", [{"_id": "extra", "text": "a brand new text"}])
    assert runner.invoke(app, ["index", "add", str(folder), str(added), "--no-cache"]).exit_code == 0
    assert Index.open(folder).count == 61
    result = runner.invoke(app, ["index", "add", str(folder), str(added)])
    assert result.exit_code == 2 and "already in the index" in result.output

    for bad, message in [
        (["search", str(folder)], "give a QUERY or --queries"),
        (["search", str(folder), "q", "-o", str(tmp_path / "x.jsonl")], "--output is for batch search"),
        (["search", str(folder), "--queries", str(queries), "-o", str(tmp_path / "x.csv")], "use a .jsonl or .trec"),
        (["index", "info", str(tmp_path)], "is not an lmembed index"),
        ([*args, "--kind", "annoy"], "index kind 'annoy' is unknown"),
    ]:
        result = runner.invoke(app, bad)
        assert result.exit_code == 2, (bad, result.output)
        assert message in " ".join(result.output.replace("│", " ").split()), result.output


def test_cli_help_stays_light():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from lmembed.cli.app import app\n"
        "for argv in (['--help'], ['index', '--help'], ['index', 'build', '--help'], ['search', '--help'],"
        " ['serve', '--help']):\n"
        "    result = CliRunner().invoke(app, argv)\n"
        "    assert result.exit_code == 0, result.output\n"
        "print('HEAVY', sorted(m for m in ('torch', 'faiss', 'fastapi', 'uvicorn') if m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "HEAVY []" in run.stdout, run.stdout


# ---------------------------------------------------------------------------------------------- exactness
SUBSETS = [("scifact", False), ("nfcorpus", False), ("arguana", True)]


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    return Embedder.from_pretrained(bundled_or_skip("minilm"), cache=False, show_progress=False)


@pytest.mark.bundled
@pytest.mark.parametrize(("dataset", "ignore_identical_ids"), SUBSETS)
def test_flat_search_reproduces_eval_scores(minilm, dataset, ignore_identical_ids):
    """On a subset (the bench runs the full sets): every metric `lmembed eval` reports, to the 5th decimal,
    from an index that encoded its documents itself (in chunks, so in other batches than eval did)."""
    from lmembed.evaluation.metrics import evaluate_run
    from lmembed.evaluation.tasks.retrieval import RetrievalTask

    folder = shared_or_skip(f"beir/{dataset}")
    task = RetrievalTask.from_path(folder, ignore_identical_ids=ignore_identical_ids).subsample(
        max_docs=30, max_queries=8, policy="relevant-first"
    )
    expected = task.evaluate(minilm).scores
    data = task.data
    index = Index.build(minilm, list(zip(data.corpus_ids, data.corpus_texts, strict=True)), chunk_size=7)
    results = index.search_batch(data.query_texts, k=len(data.corpus_ids))
    run = {q: {h.id: h.score for h in hits} for q, hits in zip(data.query_ids, results, strict=True)}
    got = evaluate_run(data.qrels, run, task.k_values, ignore_identical_ids=ignore_identical_ids).scores
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1.01e-5, nan_ok=True), key


def test_an_index_from_before_config_and_tokenizer_were_fingerprinted_is_refused_by_name(
    make_embedder, corpus_file, tmp_path
):
    emb = make_embedder("llama")
    folder = tmp_path / "index"
    Index.build(emb, corpus_file, folder)
    manifest_file = folder / MANIFEST_FILE
    data = json.loads(manifest_file.read_text())
    assert "-c" in data["model"]["fingerprint"]  # weights, then the config and tokenizer part
    data["model"]["fingerprint"] = data["model"]["fingerprint"].split("-")[0]  # what an older lmembed recorded
    manifest_file.write_text(json.dumps(data))
    with pytest.raises(IndexMismatchError, match=r"older lmembed.*weights only.*Rebuild the index"):
        Index.open(folder, emb)


def test_a_trec_run_keeps_scores_trec_eval_can_tell_apart():
    """Scores were written to 6 decimals: a reranker's saturated scores (0.9999969, 0.9999968) became ties, and
    trec_eval, which re-sorts by score, scored another order than the one written."""
    from lmembed.cli.index import trec_lines
    from lmembed.index.index import Hit

    hits = [Hit("a", 0.9999969, "x", 1), Hit("b", 0.9999968, "y", 2), Hit("c", 0.1 + 0.2, "z", 3)]
    lines = trec_lines(["q1"], [hits])
    assert [float(line.split()[4]) for line in lines] == [h.score for h in hits]
    assert [line.split()[3] for line in lines] == ["1", "2", "3"]


@pytest.mark.parametrize("rescore", ["float", "int8"])
def test_binary_rescoring_a_block_of_queries_at_a_time_changes_nothing(monkeypatch, rescore):
    """Every query's candidates were gathered as full vectors at once (queries x k x multiplier x dim floats);
    they are rescored a block of queries at a time, with the same hits."""
    from lmembed.index import kinds

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(300, 32)).astype(np.float32)
    queries = rng.normal(size=(25, 32)).astype(np.float32)
    index = kinds.BinaryIndex(IndexParams(kind="binary", rescore=rescore), 32)
    index.add(vectors)
    whole = index.search(queries, 10)
    monkeypatch.setattr(kinds, "RESCORE_BLOCK_BYTES", 1)  # one query a block
    blocked = index.search(queries, 10)
    np.testing.assert_array_equal(blocked[1], whole[1])
    np.testing.assert_allclose(blocked[0], whole[0], rtol=1e-6)
