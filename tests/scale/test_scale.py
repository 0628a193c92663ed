"""Sharded encoding on a real local Ray cluster (2 CPUs, started once for this module: conftest's ``cluster``) with
tiny models.

Checked here: workers give the vectors of one process bit for bit (several strategies, echo, instructions,
a saved model with a LoRA adapter and a latent-attention head loaded by each worker); a job killed mid-way
resumes and encodes only the missing shards; order and ids are kept; a bad row, a row that makes the model
fail, and a worker that dies for good each end in one clear error; ``lmembed encode --engine ray``.
The reference vectors are computed with one torch thread, as each Ray worker runs.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import REPO, build_tokenizer, tiny_model
from lmembed import Embedder, EmbeddingConfig
from lmembed.cli.app import app
from lmembed.errors import ConfigError
from lmembed.io import DataFormatError, read_corpus
from lmembed.scale import (
    BadRowError,
    EmbedderSpec,
    ShardedExecutor,
    WorkerLostError,
    encode_corpus,
    make_engine,
)
from lmembed.scale.work import Snapshot, shard_name
from lmembed.training.trainable import LoraSettings, TrainableEmbedder
from test_scale_local import INSTRUCTION, cached, corpus_texts, uncached

ray = pytest.importorskip("ray", reason="the Ray engine needs Ray Data: pip install 'lmembed[scale]'")
TESTS = Path(__file__).resolve().parent

# Workers unpickle the model providers below; they cannot import this test module, so it travels by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Poisoned:
    """Rebuilds the model from a snapshot, then fails on any batch that holds ``token``: raises, or (``die``)
    kills the worker process (with ``once``, a file: only the first time, which it marks there)."""

    def __init__(self, snapshot: Snapshot, token: int, die: bool = False, once: Path | None = None) -> None:
        self.snapshot, self.token, self.die, self.once = snapshot, token, die, once

    def load(self, device: str) -> Embedder:
        emb = self.snapshot.load(device)
        forward, token, die, once = emb.backbone.model.forward, self.token, self.die, self.once

        @functools.wraps(forward)  # keeps the signature: the engine passes position ids to models that take them
        def poisoned(*args, input_ids=None, **kwargs):
            if input_ids is not None and bool((input_ids == token).any()) and not (once and once.exists()):
                if die:
                    if once:
                        once.touch()
                    os._exit(3)
                raise RuntimeError("the model cannot take this token")
            return forward(*args, input_ids=input_ids, **kwargs)

        emb.backbone.model.forward = poisoned
        return emb


def write_beir(folder: Path, texts: list[str]) -> list[str]:
    """A BEIR corpus whose ids are not row numbers (and whose texts repeat); returns the ids."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = [f"doc-{(7 * i) % 1000:03d}" for i in range(len(texts))]
    rows = (json.dumps({"_id": i, "text": t}) + "\n" for i, t in zip(ids, texts, strict=True))
    (folder / "corpus.jsonl").write_text("".join(rows))
    return ids


# ---------------------------------------------------------------------------------------------- exactness
def test_ray_workers_give_the_vectors_of_one_process(cluster, tmp_path, one_torch_thread):
    emb = uncached("llama")
    configs = [  # strategies that share forward passes: one job (echo, last-token ... are checked in test_scale_local)
        emb.config,
        emb.config.with_options(pooling="weighted_mean", layer=(1, 2), final_norm=True),
        emb.config.with_options(layer=1, dim=16),
    ]
    texts = corpus_texts(120)
    expected = emb.encode_strategies(texts, configs, batch_size=8, instruction=INSTRUCTION)
    sharded = cached(emb, tmp_path).with_executor(ShardedExecutor(make_engine("ray", workers=2), shard_rows=16))
    got = sharded.encode_strategies(texts, configs, batch_size=8, instruction=INSTRUCTION)
    for config, a, b in zip(configs, got, expected, strict=True):
        assert np.array_equal(a, b), config.label()
    (report,) = sharded.executor.reports
    assert report.engine["engine"] == "ray" and report.engine["workers"] == 2 and report.shards == 8


@pytest.mark.slow  # about 18 s of a Ray cluster; the default run keeps the other ray CLI checks
def test_ray_data_warning_about_lmembed_own_read_function_is_quiet(cluster, tmp_path, monkeypatch):
    """Ray Data warns that "your read function" is large when an in-memory corpus travels with it (SciFact does):
    the function is lmembed's, so the user is not told to fix it (it printed on every eval on Ray)."""
    import warnings

    from ray.data._internal.planner import plan_read_op
    from ray.util.debug import reset_log_once

    monkeypatch.setattr(plan_read_op, "TASK_SIZE_WARN_THRESHOLD_BYTES", 0)  # every read task is "large"
    reset_log_once()
    emb = cached(uncached("llama"), tmp_path)
    sharded = emb.with_executor(ShardedExecutor(make_engine("ray", workers=1), shard_rows=16))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sharded.encode(corpus_texts(20), batch_size=8)
    assert not [w for w in caught if "read function" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.slow  # about 17 s of a Ray cluster; saved folders with adapters load on workers as locally (tests/models)
def test_workers_load_a_saved_model_with_lora_adapter_and_latent_head(cluster, tmp_path, one_torch_thread):
    base = uncached("qwen2", pooling="latent_attention", latent={"num_latents": 8, "num_heads": 4})
    trainable = TrainableEmbedder(base, lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    with torch.no_grad():
        for name, param in trainable.named_trainable_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    folder = trainable.save(tmp_path / "model", merge_lora=False)
    assert (folder / "adapter_config.json").exists() and (folder / "pooling_head.safetensors").exists()
    texts = corpus_texts(60)
    expected = Embedder.from_pretrained(str(folder), cache=False, show_progress=False).encode(texts, batch_size=8)
    driver = Embedder.from_pretrained(str(folder), cache_dir=tmp_path / "cache", show_progress=False)
    done = encode_corpus(
        driver, texts, engine=make_engine("ray", workers=1), spec=EmbedderSpec(str(folder)), batch_size=8, shard_rows=24
    )
    assert np.array_equal(done.vectors, expected)


# ---------------------------------------------------------------------------------------------- resume
CHILD = """
import functools, sys, time
sys.path[:0] = [sys.argv[1], str(__import__('pathlib').Path(sys.argv[1]).parent)]  # this folder, then tests/ (conftest)
from test_scale_local import cached, uncached
from lmembed.scale import encode_corpus, make_engine
from lmembed.scale.work import Snapshot

class Slow:  # defined in __main__, so it travels to the workers by value
    def __init__(self, snapshot):
        self.snapshot = snapshot
    def load(self, device):
        emb = self.snapshot.load(device)
        forward = emb.backbone.model.forward
        @functools.wraps(forward)  # keeps the signature: the engine passes position ids to models that take them
        def slow(*args, **kwargs):
            time.sleep(0.4)
            return forward(*args, **kwargs)
        emb.backbone.model.forward = slow
        return emb

address, cache, corpus = sys.argv[2:5]
emb = cached(uncached("llama"), cache)
engine = make_engine("ray", ray_address=address, workers=1)
encode_corpus(emb, corpus, engine=engine, batch_size=8, shard_rows=16, spec=Slow(Snapshot.of(emb)),
              on_progress=lambda p: print(p.line(), flush=True))
print("finished", flush=True)
"""


def _shard_files(cache: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in cache.rglob("shard-*.npz")}


@pytest.mark.slow  # 30-47 s: a killed driver, then Ray freeing its CPU; the local resume tests stay in the default run
def test_killed_job_resumes_with_only_the_missing_shards(cluster, tmp_path, one_torch_thread):
    texts = corpus_texts(120)
    ids = write_beir(tmp_path / "beir", texts)
    cache = tmp_path / "cache"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(TESTS), cluster, str(cache), str(tmp_path / "beir")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines = []
    for line in child.stdout:  # a driver on the same cluster, slowed down to 0.4 s per batch
        lines.append(line)
        if line.startswith("encode: 2/"):
            break
    child.kill()
    _, errors = child.communicate(timeout=60)
    assert lines and lines[-1].startswith("encode: 2/"), "".join(lines) + errors[-3000:]
    for _ in range(120):  # Ray stops the dead driver's worker and frees its CPU (within seconds)
        if ray.available_resources().get("CPU", 0) >= ray.cluster_resources()["CPU"]:
            break
        time.sleep(0.5)
    before = _shard_files(cache)

    emb = cached(uncached("llama"), cache)
    done = encode_corpus(emb, tmp_path / "beir", engine=make_engine("ray", workers=2), batch_size=8, shard_rows=16)
    report = done.report
    assert not report.planned  # the plan (and the staged texts) of the killed run were reused
    assert 2 <= len(report.shards_skipped) < report.shards
    assert report.shards_encoded == sorted(set(range(report.shards)) - set(report.shards_skipped))
    after = _shard_files(cache)
    for shard in report.shards_skipped:  # finished shards were not written again
        name = shard_name(report.job_id, shard) + ".npz"
        assert after[name] == before[name]
    assert done.ids == ids == read_corpus(tmp_path / "beir" / "corpus.jsonl")[0]  # input order, with ids
    assert np.array_equal(done.vectors, uncached("llama").encode(texts, batch_size=8))


# ---------------------------------------------------------------------------------------------- errors
def test_a_bad_row_read_on_a_worker_is_one_error_naming_it(cluster, tmp_path):
    texts = ["fine", "also fine", "bad \ud800 text", "fine again"]
    write_beir(tmp_path / "beir", texts)
    emb = cached(uncached("llama"), tmp_path / "cache")
    with pytest.raises(DataFormatError) as caught:  # the reader refuses the row, on the worker that reads it
        encode_corpus(emb, tmp_path / "beir", engine=make_engine("ray", workers=1))
    assert type(caught.value) is DataFormatError  # not a Ray wrapper
    assert str(caught.value).startswith(f"{tmp_path / 'beir' / 'corpus.jsonl'}:3: field 'text' holds a lone surrogate")


@pytest.mark.slow  # about 9 s of a Ray cluster; the default run keeps the bad-row-read and dead-worker cases
def test_a_row_the_model_fails_on_is_named(cluster, tmp_path):
    emb = cached(uncached("llama"), tmp_path / "cache")
    texts = corpus_texts(60)
    texts[33] = "the cat !"  # the only text with a "!"
    token = emb.backbone.tokenizer.convert_tokens_to_ids("!")
    provider = Poisoned(Snapshot.of(emb), token)
    engine = make_engine("ray", workers=1)
    named = r"^texts\[33\] \(row 33, id '33'\): encoding failed: RuntimeError: the model cannot take this token$"
    with pytest.raises(BadRowError, match=named) as caught:
        encode_corpus(emb, texts, engine=engine, spec=provider, batch_size=8, shard_rows=16)
    assert type(caught.value) is BadRowError


@pytest.mark.slow  # about 9 s of a Ray cluster; the default run keeps a bad row read on a worker, named
def test_a_worker_that_dies_for_good_is_one_clear_error(cluster, tmp_path):
    emb = cached(uncached("llama"), tmp_path / "cache")
    texts = corpus_texts(80)
    texts[50] = "!"  # one of the shortest texts: planned into the last shard
    token = emb.backbone.tokenizer.convert_tokens_to_ids("!")
    dying = Poisoned(Snapshot.of(emb), token, die=True)
    engine = make_engine("ray", workers=1, worker_restarts=0)
    with pytest.raises(WorkerLostError, match=r"died and did not come back after 0 restart\(s\).*run the same job"):
        encode_corpus(emb, texts, engine=engine, spec=dying, batch_size=8, shard_rows=8)
    assert _shard_files(tmp_path / "cache")  # shards finished before the death stay for the next run


@pytest.mark.slow  # about 17 s of a Ray cluster; the default run keeps the worker that dies for good
def test_a_worker_that_dies_once_is_replaced_and_the_job_finishes(cluster, tmp_path, one_torch_thread):
    emb = cached(uncached("llama"), tmp_path / "cache")
    texts = corpus_texts(80)
    texts[50] = "!"
    token = emb.backbone.tokenizer.convert_tokens_to_ids("!")
    dying = Poisoned(Snapshot.of(emb), token, die=True, once=tmp_path / "died")
    engine = make_engine("ray", workers=1, worker_restarts=1)
    done = encode_corpus(emb, texts, engine=engine, spec=dying, batch_size=8, shard_rows=8)
    assert (tmp_path / "died").exists()  # the worker did die, and the shards it left were run by a new one
    assert sorted(set(done.report.shards_encoded)) == list(range(done.report.shards))
    assert np.array_equal(done.vectors, uncached("llama").encode(texts, batch_size=8))


def test_lmembed_errors_cross_process_boundaries_whole():
    import pickle

    from lmembed.io import DataFormatError

    error = DataFormatError("/data/rows.jsonl", 57, "invalid JSON")
    for dumps, loads in ((pickle.dumps, pickle.loads), (ray.cloudpickle.dumps, ray.cloudpickle.loads)):
        back = loads(dumps(error))
        assert type(back) is DataFormatError and str(back) == "/data/rows.jsonl:57: invalid JSON"
        assert (back.path, back.line_no, back.reason) == (Path("/data/rows.jsonl"), 57, "invalid JSON")


# ---------------------------------------------------------------------------------------------- command line
@pytest.mark.slow  # about 14 s of a Ray cluster and a subprocess; the default run keeps the bad-row-read case
def test_encode_command_names_a_malformed_row_read_on_ray_once(cluster, tmp_path, monkeypatch):
    """Row 57 of the file is not JSON: the plan pass reads it on a Ray worker; the user sees one line naming
    file and line (Ray's own log quiet without --verbose), exit 2, and no output file."""
    model = str(uncached("llama").save(tmp_path / "model"))
    rows = [json.dumps({"text": text}) for text in corpus_texts(100)]
    rows[56] = '{"text": "a broken row'
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join(rows) + "\n")
    output = tmp_path / "out.npy"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(TESTS.parent)]), "LMEMBED_VERBOSE": ""}
    env["LMEMBED_CACHE"] = str(tmp_path / "cache")
    argv = ["encode", str(source), "-o", str(output), "--model", model, "--engine", "ray", "--ray-address", cluster]
    done = subprocess.run(
        [sys.executable, "-m", "lmembed.cli", *argv, "--workers", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]
    assert done.returncode == 2, done.stderr
    assert lines == [
        f"error: {source}:57: invalid JSON (Unterminated string starting at at column 10)",
        "run with --debug or LMEMBED_DEBUG=1 for the traceback",
    ], done.stderr
    assert done.stdout == "" and not output.exists()

    rows[56] = json.dumps({"body": "no text field"})
    source.write_text("\n".join(rows) + "\n")
    result = CliRunner().invoke(app, [*argv, "--workers", "1"])
    assert result.exit_code == 2
    named = f"error: {source}:57: expected an object with a string field 'text'"
    assert named in " ".join(result.output.split()), result.output
    assert result.output.count(":57:") == 1 and not output.exists()


@pytest.mark.slow  # about 10 s of a Ray cluster; the command line on Ray stays in the default run (eval)
def test_encode_command_on_ray_writes_the_local_vectors(cluster, tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setenv("LMEMBED_CACHE", str(tmp_path / "cache"))
    model = str(uncached("llama").save(tmp_path / "model"))
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(corpus_texts(50)) + "\n")
    runner = CliRunner()
    local = runner.invoke(app, ["encode", str(source), "-o", str(tmp_path / "local.npy"), "--model", model])
    assert local.exit_code == 0, local.output
    args = ["encode", str(source), "-o", str(tmp_path / "ray.npy"), "--model", model, "--batch-size", "32"]
    ray_args = ["--engine", "ray", "--ray-address", cluster, "--workers", "1", "--gpus-per-worker", "0"]
    on_ray = runner.invoke(app, [*args, *ray_args])
    assert on_ray.exit_code == 0, on_ray.output
    assert "encode: 1/1 shards" in on_ray.output and "[ray: 1 shards, 1 encoded now, 0 resumed]" in on_ray.output
    assert np.array_equal(np.load(tmp_path / "ray.npy"), np.load(tmp_path / "local.npy"))
    for option, value in [("--ray-address", cluster), ("--workers", "1"), ("--gpus-per-worker", "0")]:
        refused = runner.invoke(app, ["encode", str(source), "-o", str(tmp_path / "x.npy"), option, value])
        assert refused.exit_code == 2 and f"{option} needs --engine ray" in refused.output
    negative = runner.invoke(app, [*args, "--engine", "ray", "--gpus-per-worker", "-1"])
    assert negative.exit_code == 2 and "--gpus-per-worker" in negative.output


def test_gpus_per_worker_decides_where_workers_run_without_asking_the_cluster():
    """0 keeps the workers on CPUs (with their thread budget) even on a cluster with GPUs; a fraction shares a GPU;
    neither asks the cluster anything (no cluster is started here)."""
    on_cpus = make_engine("ray", gpus_per_worker=0, threads_per_worker=2)
    assert not on_cpus.uses_gpus() and on_cpus.threads() == 2
    assert on_cpus._resources() == {"num_cpus": 2}
    shared = make_engine("ray", gpus_per_worker=0.5)
    assert shared.uses_gpus() and shared.threads() is None
    assert shared._resources() == {"num_gpus": 0.5, "num_cpus": 1}
    assert not on_cpus.started_here and not shared.started_here
    with pytest.raises(ConfigError, match="gpus_per_worker=-1 must be >= 0"):
        make_engine("ray", gpus_per_worker=-1)


@pytest.mark.slow  # about 10 s of a Ray cluster; the default run keeps encode on Ray with the torch backend
def test_encode_command_on_ray_runs_the_backend_it_is_given(cluster, tmp_path, monkeypatch, one_torch_thread):
    """``--backend onnx`` on Ray: the workers run the ONNX backend their model loads with (they used to build a torch
    engine whatever the backend), the vectors are local ONNX's, and they are cached under the ONNX key, as local
    encoding keys them."""
    monkeypatch.setenv("LMEMBED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LMEMBED_HOME", str(tmp_path / "home"))
    model = str(uncached("bert").save(tmp_path / "model"))
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(corpus_texts(40)) + "\n")
    runner = CliRunner()
    onnx = ["--model", model, "--backend", "onnx"]
    local = runner.invoke(app, ["encode", str(source), "-o", str(tmp_path / "local.npy"), *onnx, "--no-cache"])
    assert local.exit_code == 0, local.output
    ray_args = ["--engine", "ray", "--ray-address", cluster, "--workers", "1"]
    on_ray = runner.invoke(app, ["encode", str(source), "-o", str(tmp_path / "ray.npy"), *onnx, *ray_args])
    assert on_ray.exit_code == 0, on_ray.output
    assert "[ray: 1 shards, 1 encoded now, 0 resumed]" in on_ray.output
    np.testing.assert_allclose(np.load(tmp_path / "ray.npy"), np.load(tmp_path / "local.npy"), atol=1e-6)
    keys = [folder.name for folder in (tmp_path / "cache").iterdir()]
    assert len(keys) == 1 and keys[0].endswith("-onnx-float32"), keys


@pytest.mark.slow  # about 18 s of a Ray cluster; the default run keeps the other ray CLI checks
def test_encode_command_on_ray_takes_the_prompt_name_and_the_default_prompt(
    cluster, tmp_path, monkeypatch, one_torch_thread
):
    """A sentence-transformers folder with prompts (saved by lmembed, read back as a published model): --prompt-name
    and, without it, the default prompt give on Ray the vectors they give locally."""
    monkeypatch.setenv("LMEMBED_CACHE", str(tmp_path / "cache"))
    prompts = {"query": "query :", "x": "cat dog gene"}
    emb = uncached("llama", prompt_style="sentence_transformers", prompts=prompts, default_prompt_name="query")
    model = str(emb.save(tmp_path / "model"))
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(t for t in corpus_texts(30) if t) + "\n")  # the prompt is not pooled: no empty text
    runner = CliRunner()
    vectors = {}
    for engine in ("local", "ray"):
        for name, extra in (("x", ["--prompt-name", "x"]), ("default", [])):
            out = tmp_path / f"{engine}-{name}.npy"
            argv = ["encode", str(source), "-o", str(out), "--model", model, "--engine", engine, *extra]
            result = runner.invoke(app, [*argv, *(["--workers", "1"] if engine == "ray" else [])])
            assert result.exit_code == 0, result.output
            vectors[engine, name] = np.load(out)
    assert not np.array_equal(vectors["local", "x"], vectors["local", "default"])  # the prompt changes the vectors
    for name in ("x", "default"):
        assert np.array_equal(vectors["ray", name], vectors["local", name]), name


@pytest.mark.slow  # about 17 s of a Ray cluster; `encode` on Ray is checked by the other ray CLI cases
def test_encode_command_on_ray_reads_each_side_as_locally(cluster, tmp_path, monkeypatch, one_torch_thread):
    """--side query / document on Ray: the workers read the side's strategy (the term channel's query or document
    weighting) and prompt (the query instruction for queries only), as the local command does."""
    monkeypatch.setenv("LMEMBED_CACHE", str(tmp_path / "cache"))
    texts = [t for t in corpus_texts(30) if t]
    emb = uncached("bert", pooling="mean", query_instruction=INSTRUCTION).fit_terms(texts, dims=64)
    model = str(emb.save(tmp_path / "model"))
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n")
    runner = CliRunner()
    vectors = {}
    for engine in ("local", "ray"):
        for side in ("query", "document"):
            out = tmp_path / f"{engine}-{side}.npy"
            argv = ["encode", str(source), "-o", str(out), "--model", model, "--engine", engine, "--side", side]
            result = runner.invoke(app, [*argv, *(["--workers", "1"] if engine == "ray" else [])])
            assert result.exit_code == 0, result.output
            vectors[engine, side] = np.load(out)
    assert not np.allclose(vectors["local", "query"], vectors["local", "document"], atol=1e-3)
    for side in ("query", "document"):
        assert np.array_equal(vectors["ray", side], vectors["local", side]), side


@pytest.mark.slow  # about 10 s of a Ray cluster; the default run keeps Ray's workers giving one process's vectors
def test_index_build_on_ray_holds_the_local_vectors(cluster, tmp_path, monkeypatch, one_torch_thread):
    from lmembed.index import Index

    monkeypatch.setenv("LMEMBED_CACHE", str(tmp_path / "cache"))
    emb = uncached("llama")
    model = str(emb.save(tmp_path / "model"))
    texts = corpus_texts(40)
    write_beir(tmp_path / "beir", texts)
    runner = CliRunner()
    for engine in ("local", "ray"):
        args = ["index", "build", str(tmp_path / "beir"), "-o", str(tmp_path / engine), "--model", model]
        result = runner.invoke(app, [*args, "--engine", engine, *(["--workers", "1"] if engine == "ray" else [])])
        assert result.exit_code == 0, result.output
    queries = emb.encode(["the cat sat", "protein gene study"])
    local, on_ray = (Index.open(tmp_path / name).search_vectors(queries, k=5) for name in ("local", "ray"))
    assert all(np.array_equal(a, b) for a, b in zip(local, on_ray, strict=True))


@pytest.mark.slow
def test_eval_command_on_ray_scores_as_local(cluster, tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.setenv("LMEMBED_CACHE", str(tmp_path / "cache"))
    model = str(uncached("llama").save(tmp_path / "model"))
    folder = tmp_path / "toy"
    write_beir(folder, corpus_texts(60))
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": f"cat {i}"}) + "\n" for i in range(6))
    )
    (folder / "qrels").mkdir()
    (folder / "qrels" / "test.tsv").write_text("".join(f"q{i}\tdoc-{7 * i:03d}\t1\n" for i in range(6)))
    runner = CliRunner()
    scores = {}
    for engine in ("local", "ray"):
        args = ["eval", "--model", model, "--data", str(folder), "-o", str(tmp_path / engine), "--engine", engine]
        result = runner.invoke(app, [*args, *(["--workers", "1"] if engine == "ray" else [])])
        assert result.exit_code == 0, result.output
        (written,) = (tmp_path / engine).rglob("toy*.json")
        scores[engine] = json.loads(written.read_text())
    local, on_ray = scores["local"], scores["ray"]
    assert json.dumps(on_ray["scores"]) == json.dumps(local["scores"])
    stated = json.dumps(on_ray["lmembed"])  # the result says the corpus was memory-mapped from the cache
    assert '"corpus_embeddings"' in stated and '"memory_mapped": true' in stated
    assert '"corpus_embeddings"' not in json.dumps(local)


@pytest.mark.gpu
def test_gpu_workers_give_the_vectors_of_one_gpu_process(cluster, tmp_path):
    """One actor per GPU (num_gpus=1), bfloat16: the vectors of a single process on the same kind of GPU."""
    if not torch.cuda.is_available() or ray.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("needs a CUDA GPU visible to the Ray cluster")
    tokenizer = build_tokenizer()
    model = tiny_model("llama", len(tokenizer)).to("cuda", torch.bfloat16)
    single = Embedder.from_model(model, tokenizer, EmbeddingConfig(), use_cache=False, show_progress=False)
    texts = corpus_texts(200)
    expected = single.encode(texts, batch_size=16)
    emb = Embedder.from_model(model, tokenizer, EmbeddingConfig(), cache_dir=tmp_path, show_progress=False)
    done = encode_corpus(emb, texts, engine=make_engine("ray", gpus_per_worker=1), batch_size=16, shard_rows=32)
    assert done.report.engine["gpus"] and done.report.engine["threads_per_worker"] is None
    assert np.array_equal(done.vectors, expected)


def test_starting_ray_keeps_the_sigterm_handler_in_place(monkeypatch):
    """Ray's core puts in a SIGTERM handler that dumps a stack and aborts (exit 134, no finished shard kept); the
    handler in place before (lmembed's: stop as Ctrl-C does, exit 143) is put back once the cluster is joined."""
    import signal

    import lmembed.scale.ray_engine as ray_engine
    from lmembed.errors import sigterm_interrupts

    def init(**options):  # what Ray's core does to the process's SIGTERM handling
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    monkeypatch.setattr(ray_engine.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_engine.ray, "init", init)
    with sigterm_interrupts():
        ours = signal.getsignal(signal.SIGTERM)
        ray_engine.RayEngine().start()
        assert signal.getsignal(signal.SIGTERM) is ours
