"""Synthesis and evaluation jobs on a real local Ray cluster (conftest's ``cluster``, one per module).

Checked here: ``synthesize`` on Ray writes the output of a local run byte for byte (the deterministic tiny
generator; E5-mistral, and corpus-only with an embedder each worker loads by name), its progress reads rows/s,
acceptance and ETA, and a run stopped by a generator error raised on a worker ends in that error, as itself,
and resumes generating only the missing shards; on the command line, an error raised on a worker (a dead
endpoint) or a malformed corpus line is one line naming it, exit 2, with Ray's own output quiet and no partial
output; ``lmembed eval --engine ray`` likewise for a malformed corpus line and a broken data folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO
from lmembed.cli.app import app
from lmembed.scale import make_engine
from lmembed.synthesis.generators import GeneratorError, TinyGenerator
from lmembed.synthesis.synthesize import synthesize

ray = pytest.importorskip("ray", reason="the Ray engine needs Ray Data: pip install 'lmembed[scale]'")
TESTS = Path(__file__).resolve().parents[1]
SERVER = TESTS / "synthesis" / "openai_server.py"

# Ray workers unpickle the generator below; they cannot import this test module, so it travels by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class BreaksAfter(TinyGenerator):
    """The tiny generator (same answers, same name) that breaks down after ``calls`` generate calls, counted in
    each copy: the brainstorm takes one on the driver, the rest are one per shard on the worker."""

    def __init__(self, calls: int) -> None:
        super().__init__()
        self.calls_left = calls

    def generate(self, requests):
        if self.calls_left == 0:
            raise GeneratorError("the generator broke down")
        self.calls_left -= 1
        return super().generate(requests)


def _subprocess_env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(TESTS)]), "LMEMBED_VERBOSE": ""}
    return {**env, "LMEMBED_CACHE": str(tmp_path / "cache")}


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]


# ---------------------------------------------------------------------------------------------- synthesis
@pytest.mark.slow  # about 11 s of a Ray cluster; synthesis's resume stays in the default run locally
def test_synthesis_on_ray_writes_the_local_output_and_resumes_after_a_worker_error(cluster, tmp_path):
    local = synthesize("e5-mistral", TinyGenerator(), tmp_path / "local" / "out.jsonl", shard_size=5)
    out = tmp_path / "ray" / "out.jsonl"
    parts = out.with_name("out.jsonl.parts")
    with pytest.raises(GeneratorError) as caught:  # raised on the Ray worker, in its third shard
        synthesize("e5-mistral", BreaksAfter(3), out, shard_size=5, engine=make_engine("ray", workers=1))
    assert type(caught.value) is GeneratorError and str(caught.value) == "the generator broke down"
    landed = sorted(p.name for p in parts.glob("shard-*"))
    assert len(landed) == 4 and all(n.endswith((".jsonl", ".stats.json")) for n in landed)  # two whole shards
    assert not out.exists()

    lines: list[str] = []
    again = synthesize(
        "e5-mistral", TinyGenerator(), out, shard_size=5, engine=make_engine("ray", workers=2), echo=lines.append
    )
    assert again["shards_generated_now"] == again["shards"] - 2 == local["shards"] - 2
    assert again["usage_now"]["requests"] == again["attempted"] - 10  # no brainstorm, nor the two shards, again
    assert lines[0] == f"resuming: 2 of {again['shards']} shards already done"
    assert all("rows/s" in line and "acceptance" in line and "ETA" in line for line in lines[1:])
    assert len(lines) == again["shards"] - 1
    assert out.read_text() == (tmp_path / "local" / "out.jsonl").read_text()
    assert (again["rows"], again["rejected"]) == (local["rows"], local["rejected"])


@pytest.mark.slow  # about 9 s of a Ray cluster; Ray's workers giving one process's vectors stay in the default run
def test_corpus_only_on_ray_retrieves_with_an_embedder_each_worker_loads(cluster, tmp_path, one_torch_thread):
    from lmembed.synthesis.retrieval import EmbedderEncode
    from test_scale_local import corpus_texts, uncached

    texts = [t for t in corpus_texts(12) if t]
    ids = [f"p{i}" for i in range(len(texts))]
    encode = EmbedderEncode(str(uncached("llama").save(tmp_path / "model")), {"cache": False, "show_progress": False})
    written = {}
    for name, engine in (("local", None), ("ray", make_engine("ray", workers=1))):
        out = tmp_path / name / "co.jsonl"
        stats = synthesize(
            "corpus-only", TinyGenerator(), out, corpus=(ids, texts), encode=encode, engine=engine, shard_size=4
        )
        written[name] = out.read_text()
    assert stats["rows"] > 0 and stats["shards_generated_now"] == 4
    assert written["ray"] == written["local"]  # the worker's embedder (loaded there by name) ranks as the local one


def _start_server(port_file: Path, die_after: int) -> subprocess.Popen:
    """The test OpenAI-compatible server on a free port, exiting after ``die_after`` answers."""
    import socket
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), str(port)],
        env={**os.environ, "DIE_AFTER": str(die_after)},
        stderr=subprocess.PIPE,
    )
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
            port_file.write_text(str(port))
            return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the test server did not start")


@pytest.mark.slow  # about 17 s of a Ray cluster; synthesis on Ray and its resume stay in the default run
def test_synthesize_command_on_ray_names_a_worker_error_and_a_bad_corpus_line_once(cluster, tmp_path):
    server = _start_server(tmp_path / "port", die_after=6)  # answers the six brainstorm requests, then dies
    try:
        url = f"http://127.0.0.1:{(tmp_path / 'port').read_text()}/v1"
        out = tmp_path / "syn.jsonl"
        argv = ["synthesize", "--recipe", "e5-mistral", "-o", str(out), "--generator", url, "--retries", "0"]
        argv += ["--concurrency", "1", "--limit", "4", "--shard-size", "4"]  # one shard: its first request kills it
        done = subprocess.run(
            [sys.executable, "-m", "lmembed.cli", *argv, "--engine", "ray", "--ray-address", cluster, "--workers", "1"],
            capture_output=True,
            text=True,
            env=_subprocess_env(tmp_path),
            timeout=300,
        )
    finally:
        server.kill()
        server.wait()
    assert done.returncode == 2, done.stderr
    first, *rest = _error_lines(done.stderr)
    # the dying server either closes the connection (RemoteProtocolError) or resets it (ReadError): timing decides
    assert re.fullmatch(
        rf"error: {re.escape(url)}/chat/completions: gave up after 1 tries: cannot reach the server "
        r"\((RemoteProtocolError: Server disconnected without sending a response\.|ReadError: \[Errno 104\] "
        r"Connection reset by peer)\)",
        first,
    ), done.stderr
    assert rest == ["run with --debug or LMEMBED_DEBUG=1 for the traceback"], done.stderr
    assert done.stdout == "" and not out.exists()
    assert not list(out.with_name("syn.jsonl.parts").glob("shard-*"))  # no shard, whole or partial

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "a", "text": "river stone"}\n{"_id": "b", "text": "ocean\n{"_id": "c", "text": "x"}\n')
    out = tmp_path / "gecko.jsonl"
    argv = ["synthesize", "--recipe", "gecko", "-o", str(out), "--corpus", str(corpus), "--embedder", "minilm"]
    result = CliRunner().invoke(app, [*argv, "--engine", "ray", "--ray-address", cluster, "--workers", "1"])
    assert result.exit_code == 2, result.output
    named = f"error: {corpus}:2: invalid JSON"
    assert " ".join(result.output.split()).startswith(named), result.output
    assert result.output.count(":2:") == 1 and not out.exists() and not out.with_name("gecko.jsonl.parts").exists()


# ---------------------------------------------------------------------------------------------- evaluation
def test_eval_command_on_ray_names_a_malformed_corpus_line_once(cluster, tmp_path):
    from helpers import TOY_DOCS, write_beir
    from test_scale_local import uncached

    model = str(uncached("llama").save(tmp_path / "model"))
    folder = write_beir(
        tmp_path / "toy", [(f"d{i}", t) for i, t in enumerate(TOY_DOCS)], [("q0", "cat")], [("q0", "d0")]
    )
    lines = (folder / "corpus.jsonl").read_text().splitlines()
    lines[4] = '{"_id": "d4", "text": "a man was riding'
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "results"
    argv = ["eval", "--model", model, "--data", str(folder), "-o", str(out), "--engine", "ray"]
    done = subprocess.run(
        [sys.executable, "-m", "lmembed.cli", *argv, "--ray-address", cluster, "--workers", "1"],
        capture_output=True,
        text=True,
        env=_subprocess_env(tmp_path),
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in _error_lines(done.stderr) if not line.startswith("• ")]
    assert errors == [
        f"error: {folder / 'corpus.jsonl'}:5: invalid JSON (Unterminated string starting at at column 23)",
        "run with --debug or LMEMBED_DEBUG=1 for the traceback",
    ], done.stderr
    assert not out.exists()  # no partial results

    (folder / "corpus.jsonl").unlink()  # a data folder without its corpus
    result = CliRunner().invoke(app, [*argv, "--ray-address", cluster, "--workers", "1"])
    assert result.exit_code == 2, result.output
    named = f"error: cannot tell the task type of {folder / 'queries.jsonl'} from its fields ['_id', 'text']"
    assert result.output.splitlines()[0] == named and result.output.count("error:") == 1, result.output
    assert not out.exists()
