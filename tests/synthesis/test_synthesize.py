"""lmembed synthesize: the E5-mistral recipe through the tiny generator and through a real OpenAI-compatible
server (started on a free loopback port), strict parsing, sharding and resume, the command line."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from lmembed.cli.app import app
from lmembed.synthesis.generators import Budget, EndpointGenerator, GeneratorError, Request, TinyGenerator
from lmembed.synthesis.parsing import parse_object, parse_string_list
from lmembed.synthesis.runner import PlanMismatch, ShardError
from lmembed.synthesis.synthesize import synthesize
from lmembed.training.rows import read_jsonl_examples

SERVER = Path(__file__).with_name("openai_server.py")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_e5_mistral_rows_are_training_rows_with_provenance_and_rejections_by_reason(tmp_path):
    out = tmp_path / "syn.jsonl"
    stats = synthesize("e5-mistral", TinyGenerator(seed=3, malformed_rate=0.3), out, shard_size=5)
    rows = _lines(out)
    assert rows and stats["rows"] == len(rows)
    assert sum(stats["rejected"].values()) == stats["attempted"] - len(rows) > 0
    assert set(stats["rejected"]) <= {
        "not_json",
        "wrong_type",
        "missing_field",
        "empty_field",
        "positive_repeats_query",
    }
    assert set(stats["rejected_samples"]) == set(stats["rejected"])  # what the generator wrote, per reason
    examples, skipped = read_jsonl_examples(out)  # lmembed train --data reads it as it is
    assert len(examples) == len(rows) and skipped == 0
    families = {r["task"] for r in rows}
    assert {"short-long", "sts"} <= families
    assert all(r["symmetric"] == (r["task"] == "sts") for r in rows)
    prov = rows[0]["provenance"]
    assert prov["generator"] == "tiny" and prov["kind"] == "e5-mistral" and prov["version"] == "1"
    assert prov["recipe"].endswith("e5-mistral.yaml") and prov["prompt"].endswith(".generate")
    assert set(prov["knobs"]) == {"query_length", "clarity", "difficulty", "num_words", "language"}
    saved = json.loads((tmp_path / "syn.jsonl.stats.json").read_text())
    assert saved["rows"] == len(rows)


def test_the_same_seed_gives_the_same_rows_and_another_seed_other_knobs(tmp_path):
    a = synthesize("e5-mistral", TinyGenerator(), tmp_path / "a.jsonl", seed=1)
    b = synthesize("e5-mistral", TinyGenerator(), tmp_path / "b.jsonl", seed=1)
    c = synthesize("e5-mistral", TinyGenerator(), tmp_path / "c.jsonl", seed=2)
    assert a["rows"] == b["rows"]
    assert (tmp_path / "a.jsonl").read_text().replace("a.jsonl", "") == (tmp_path / "b.jsonl").read_text()
    knobs = lambda p: [r["provenance"]["knobs"] for r in _lines(p)]  # noqa: E731
    assert knobs(tmp_path / "a.jsonl") != knobs(tmp_path / "c.jsonl") or c["rows"] != a["rows"]


@pytest.mark.parametrize(
    ("text", "reason", "repaired"),
    [
        ('{"q": "a", "p": "b"}', None, False),
        ('Sure! ```json\n{"q": "a", "p": "b",}\n``` hope it helps', None, True),
        ('{"q": "a", "p": "b"', "not_json", False),
        ('{"q": "a"}', "missing_field", False),
        ('{"q": "a", "p": "  "}', "empty_field", False),
        ('{"q": "a", "p": ["b"]}', "wrong_type", False),
        ('["a", "b"]', "wrong_type", False),
        ("I cannot help with that.", "not_json", False),
        ('{"q": "a \\ud83d", "p": "b"}', "invalid_unicode", False),  # half an emoji, escaped: cannot be written
        ('{"q": "a \\ud83d\\ude00", "p": "b"}', None, False),  # the whole emoji is fine
    ],
)
def test_strict_parsing_repairs_or_rejects_with_a_reason(text, reason, repaired):
    parsed = parse_object(text, ("q", "p"))
    assert parsed.reason == reason
    assert parsed.repaired is repaired
    if reason is None:
        assert parsed.value["p"] == "b" and parsed.value["q"].startswith("a")


def test_the_trailing_comma_repair_leaves_the_commas_inside_strings():
    """The repair was a regular expression over the whole answer: a query ``"a, }b"`` came back as ``"a}b"``,
    the generator's own words edited in silence."""
    parsed = parse_object('Here: {"q": "a, }b \\" ,]", "p": "b",}', ("q", "p"))
    assert parsed.value == {"q": 'a, }b " ,]', "p": "b"} and parsed.repaired
    assert parse_string_list('```json\n["x, ]", "y",\n]\n```').value == ["x, ]", "y"]


def test_half_an_emoji_is_rejected_by_every_parser_not_a_crash_at_the_shard_write():
    """An answer holding a lone surrogate (``\\ud83d``, half an emoji) parsed, and writing its shard raised
    UnicodeEncodeError: the shard was lost, and every rerun of a deterministic recipe crashed again."""
    from lmembed.synthesis.parsing import parse_query_line

    assert parse_string_list('["a", "b \\ud83d"]').reason == "invalid_unicode"
    assert parse_query_line("what binds \ud83d the protein?").reason == "invalid_unicode"
    assert parse_object("what binds \ud83d", ("query",), plain_text=True).reason == "invalid_unicode"


def test_a_single_field_answer_in_plain_text_is_repaired_only_when_allowed():
    assert parse_object('"what binds the protein?"\n', ("query",), plain_text=True).value == {
        "query": "what binds the protein?"
    }
    assert parse_object("what binds", ("query",), plain_text=True).repaired
    assert parse_object("what binds", ("query",)).reason == "not_json"
    assert parse_object("what binds", ("query", "task"), plain_text=True).reason == "not_json"
    assert parse_object('{"query": ', ("query",), plain_text=True).reason == "not_json"


def test_a_brainstorm_list_drops_empty_entries_and_rejects_prose():
    assert parse_string_list('["a", "", "b"]').value == ["a", "b"]
    assert parse_string_list("Here: 1. a 2. b").reason == "not_json"


class _Killed(RuntimeError):
    pass


class _DiesAfter(TinyGenerator):
    """A tiny generator whose process 'dies' on its N-th generate call (counting calls and requests)."""

    def __init__(self, calls: int | None) -> None:
        super().__init__()
        self.calls_left, self.requests = calls, 0

    def generate(self, requests):
        if self.calls_left is not None:
            if self.calls_left == 0:
                raise _Killed
            self.calls_left -= 1
        self.requests += len(requests)
        return super().generate(requests)


def test_a_killed_run_resumes_generating_only_the_unfinished_shards(tmp_path):
    whole = _DiesAfter(None)
    synthesize("e5-mistral", whole, tmp_path / "whole.jsonl", shard_size=6)
    out = tmp_path / "out.jsonl"
    first = _DiesAfter(3)  # the brainstorm, then two shards, then killed in the third
    with pytest.raises(_Killed):
        synthesize("e5-mistral", first, out, shard_size=6)
    parts = out.with_name("out.jsonl.parts")
    assert sorted(p.name for p in parts.glob("shard-*.stats.json")) == [
        "shard-00000.stats.json",
        "shard-00001.stats.json",
    ]
    assert not out.exists()
    second = _DiesAfter(None)
    stats = synthesize("e5-mistral", second, out, shard_size=6)
    n_items = whole.requests - 6  # six brainstorm requests, one per family
    assert second.requests == n_items - 12  # the brainstorm and the two finished shards are not generated again
    assert stats["shards_generated_now"] == stats["shards"] - 2
    assert out.read_text() == (tmp_path / "whole.jsonl").read_text().replace("whole.jsonl", "out.jsonl")


def test_a_finished_shard_changed_before_the_output_is_assembled_is_refused(tmp_path):
    """A shard's stats (written last) record the sha256 of its rows: a shard edited between runs is refused by name
    when the run resumes, never written into the output."""
    out = tmp_path / "out.jsonl"
    with pytest.raises(_Killed):
        synthesize("e5-mistral", _DiesAfter(3), out, shard_size=6)
    shard = out.with_name("out.jsonl.parts") / "shard-00000.jsonl"
    shard.write_text(shard.read_text().replace('"', "'", 1))
    with pytest.raises(
        ShardError,
        match=r"shard-00000\.jsonl: its sha256 is not the one \S*/shard-00000\.stats\.json "
        r"records \(files\.shard-00000\.jsonl\).*\. To generate this shard again \(the others are kept\), delete "
        r"shard-00000\.stats\.json and shard-00000\.jsonl from \S*out\.jsonl\.parts and run the same command",
    ):
        synthesize("e5-mistral", _DiesAfter(None), out, shard_size=6)
    assert not out.exists()
    for name in ("shard-00000.stats.json", "shard-00000.jsonl"):  # as the refusal says
        (shard.parent / name).unlink()
    again = _DiesAfter(None)
    stats = synthesize("e5-mistral", again, out, shard_size=6)
    assert stats["shards_generated_now"] == 1 and out.exists()


RECORD_DAMAGE = {
    # the digest deleted and the shard edited: the forged row went into the output
    "its digest deleted": ("shard-00000.stats.json", lambda d: d.pop("files"), r"stats.json: files: Field required"),
    "attempted as text": ("shard-00000.stats.json", lambda d: d.update(attempted="x"), r"stats.json: attempted:"),
    "rejections a list": ("shard-00000.stats.json", lambda d: d.update(rejected=[1]), r"stats.json: rejected:"),
    "the plan a list": ("plan.json", None, r"plan.json: the whole file: Input should be a valid dictionary"),
    "rows negative": ("shard-00000.stats.json", lambda d: d.update(rows=-5), r"stats.json: rows:"),
    "a file of another name": (
        "shard-00000.stats.json",
        lambda d: d["files"].update({"../rows_orig.jsonl": "0" * 64}),
        r"stats.json: files names .*not the shard's shard-00000.jsonl alone",
    ),
}


@pytest.mark.parametrize("case", RECORD_DAMAGE)
def test_a_shard_record_or_plan_of_another_shape_is_refused_naming_the_field(tmp_path, case):
    """They ended in internal errors (KeyError, TypeError, AttributeError) or were believed."""
    out = tmp_path / "out.jsonl"
    with pytest.raises(_Killed):
        synthesize("e5-mistral", _DiesAfter(3), out, shard_size=6)
    name, change, said = RECORD_DAMAGE[case]
    path = out.with_name("out.jsonl.parts") / name
    data = json.loads(path.read_text())
    if change is None:
        data = [data]
    else:
        change(data)
    path.write_text(json.dumps(data))
    if case == "its digest deleted":
        shard = path.with_name("shard-00000.jsonl")
        shard.write_text(shard.read_text().replace('"', "'", 1))
    with pytest.raises(ShardError, match=said):
        synthesize("e5-mistral", _DiesAfter(None), out, shard_size=6)
    assert not out.exists()


def test_a_kept_stage_of_another_shape_is_refused_even_with_its_digest(tmp_path):
    """A stage rewritten together with its digest ended in an internal error (a task list of numbers, no tasks)."""
    out = tmp_path / "out.jsonl"
    with pytest.raises(_Killed):
        synthesize("e5-mistral", _DiesAfter(3), out, shard_size=6)
    stage = out.with_name("out.jsonl.parts") / "stage-brainstorm.json"
    data = json.loads(stage.read_text())
    data["tasks"][next(iter(data["tasks"]))] = [1, 2]
    stage.write_text(json.dumps(data))
    stage.with_name(stage.name + ".sha256").write_text(hashlib.sha256(stage.read_bytes()).hexdigest() + "\n")
    with pytest.raises(ShardError, match=r"stage-brainstorm\.json: tasks\..*\.0: Input should be a valid string"):
        synthesize("e5-mistral", _DiesAfter(None), out, shard_size=6)


def test_a_kept_stage_is_read_back_only_as_it_was_written(tmp_path):
    """The brainstorm a rerun reuses is checked against the digest its stage wrote after it: a changed task list is
    refused by name, not used to generate the remaining shards."""
    out = tmp_path / "out.jsonl"
    with pytest.raises(_Killed):
        synthesize("e5-mistral", _DiesAfter(3), out, shard_size=6)
    stage = out.with_name("out.jsonl.parts") / "stage-brainstorm.json"
    assert (stage.parent / "stage-brainstorm.json.sha256").exists()
    stage.write_text(stage.read_text().replace('"tasks": {', '"tasks": {"injected": ["do something else"], ', 1))
    with pytest.raises(ShardError, match=r"stage-brainstorm\.json: its sha256 is not the one"):
        synthesize("e5-mistral", _DiesAfter(None), out, shard_size=6)


def test_kept_corpus_vectors_of_another_corpus_are_refused(tmp_path):
    import io

    from lmembed.synthesis.retrieval import CACHE, corpus_embeddings
    from lmembed.synthesis.runner import Context, write_stage

    buffer = io.BytesIO()
    np.save(buffer, np.zeros((3, 4), dtype=np.float32))
    write_stage(tmp_path, CACHE, buffer.getvalue())
    context = Context(recipe=None, generator=None, parts=tmp_path, corpus_texts=["a", "b"])  # type: ignore[arg-type]
    with pytest.raises(ShardError, match=r"corpus-embeddings\.npy: holds float32 vectors of shape \(3, 4\)"):
        corpus_embeddings(context)
    context.corpus_texts.append("c")
    assert corpus_embeddings(context).shape == (3, 4)


def test_a_different_plan_is_refused_not_mixed_in(tmp_path):
    synthesize("e5-mistral", TinyGenerator(), tmp_path / "o.jsonl", seed=0)
    with pytest.raises(PlanMismatch, match="seed"):
        synthesize("e5-mistral", TinyGenerator(), tmp_path / "o.jsonl", seed=5)


def test_the_same_recipe_read_from_another_place_resumes(tmp_path):
    """The plan records where the recipe file lay; a run whose recipe is the same by content (another checkout, a
    reinstall) resumes instead of being refused as 'changed: recipe'."""
    out = tmp_path / "o.jsonl"
    synthesize("e5-mistral", TinyGenerator(), out, seed=0)
    first = out.read_bytes()
    plan_file = Path(f"{out}.parts") / "plan.json"
    plan = json.loads(plan_file.read_text())
    plan["recipe"]["recipe"] = "/elsewhere/recipes/synthesis/e5-mistral.yaml"
    plan_file.write_text(json.dumps(plan))
    synthesize("e5-mistral", TinyGenerator(), out, seed=0)
    assert out.read_bytes() == first
    plan["recipe"]["digest"] = "0" * 12
    plan_file.write_text(json.dumps(plan))
    with pytest.raises(PlanMismatch, match="recipe"):
        synthesize("e5-mistral", TinyGenerator(), out, seed=0)
    plan_file.write_text(json.dumps({**json.loads(plan_file.read_text()), "written_by_another": 1}))
    with pytest.raises(PlanMismatch, match="written_by_another"):  # a key only the folder's plan has is named
        synthesize("e5-mistral", TinyGenerator(), out, seed=0)


# ------------------------------------------------------------------------------------ a real endpoint


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(port: int, **env: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(SERVER), str(port)], env={**os.environ, **env}, stderr=subprocess.PIPE)
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
            return proc
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()) from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the test server did not start")


@pytest.fixture
def server():
    started: list[subprocess.Popen] = []

    def start(port: int | None = None, **env: str) -> str:
        port = port or _free_port()
        started.append(_start(port, **env))
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_the_endpoint_generator_synthesises_through_a_real_server_with_its_key(server, tmp_path, monkeypatch):
    url = server(SERVER_KEY="sk-test")
    monkeypatch.setenv("TEST_SYNTH_KEY", "sk-test")
    gen = EndpointGenerator(url, "tiny", api_key_env="TEST_SYNTH_KEY", concurrency=3, retries=0)
    stats = synthesize("e5-mistral", gen, tmp_path / "e.jsonl", shard_size=8)
    assert stats["rows"] > 0 and stats["repaired"] == stats["rows"]  # the server wraps its JSON in code fences
    assert stats["usage_now"]["prompt_tokens"] > 0 and stats["generator"].startswith("endpoint:tiny@")
    assert read_jsonl_examples(tmp_path / "e.jsonl")[0]


def test_answers_the_server_cut_at_the_token_limit_are_counted(server):
    """An answer stopped at ``max_tokens`` (``finish_reason: "length"``) fails to parse as JSON, and was counted as
    the model's ``not_json`` alone; the generator's usage now says how many were cut at the limit."""
    gen = EndpointGenerator(server(), "tiny", retries=0)
    message = ({"role": "user", "content": 'Answer with "query": and "positive": about proteins and cells'},)
    short, whole = Request(message, max_new_tokens=3), Request(message, max_new_tokens=256)
    cut, full = gen.generate([short, whole])
    assert len(cut.split()) == 3 and len(full.split()) > 3
    assert gen.usage.cut_at_limit == 1 and parse_object(cut, ("query", "positive")).reason == "not_json"


def test_a_refused_key_is_a_clear_error_and_not_retried(server, monkeypatch):
    url = server(SERVER_KEY="sk-right")
    monkeypatch.setenv("TEST_SYNTH_KEY", "sk-wrong")
    gen = EndpointGenerator(url, "tiny", api_key_env="TEST_SYNTH_KEY", retries=3, backoff=0.01)
    with pytest.raises(GeneratorError, match=r"401.*API key was refused.*Incorrect API key"):
        gen.generate([Request(({"role": "user", "content": "hi"},))])
    assert gen.usage.retries == 0


@pytest.mark.parametrize("status", ["429", "503"])
def test_429_and_5xx_are_retried_with_backoff(server, status):
    url = server(FAIL_FIRST="2", FAIL_STATUS=status)
    gen = EndpointGenerator(url, "tiny", retries=3, backoff=0.01, concurrency=1)
    assert gen.generate([Request(({"role": "user", "content": "say words please"},))])[0]
    assert gen.usage.retries == 2
    gen_short = EndpointGenerator(server(FAIL_FIRST="5", FAIL_STATUS=status), "tiny", retries=1, backoff=0.01)
    with pytest.raises(GeneratorError, match=f"gave up after 2 tries: HTTP {status}"):
        gen_short.generate([Request(({"role": "user", "content": "x"},))])


def test_the_request_budget_stops_the_run(server):
    gen = EndpointGenerator(server(), "tiny", budget=Budget(max_requests=2), concurrency=1)
    with pytest.raises(GeneratorError, match="request budget spent: 2 of 2"):
        gen.generate([Request(({"role": "user", "content": f"q{i}"},)) for i in range(3)])


def test_a_dead_server_is_a_clear_error_and_loses_no_finished_shard(server, tmp_path):
    port = _free_port()
    out = tmp_path / "d.jsonl"
    url = server(port, DIE_AFTER="14")  # the six brainstorm requests, one shard of eight, then gone
    gen = EndpointGenerator(url, "tiny", retries=1, backoff=0.01, concurrency=1)
    with pytest.raises(GeneratorError, match="cannot reach the server"):
        synthesize("e5-mistral", gen, out, shard_size=8)
    parts = out.with_name("d.jsonl.parts")
    assert [p.name for p in parts.glob("shard-*.stats.json")] == ["shard-00000.stats.json"]
    server(port)  # the server comes back on the same address
    again = EndpointGenerator(url, "tiny", retries=1, backoff=0.01, concurrency=1)
    stats = synthesize("e5-mistral", again, out, shard_size=8)
    assert stats["shards_generated_now"] == stats["shards"] - 1
    assert again.usage.requests == stats["attempted"] - 8


# ------------------------------------------------------------------------------------ command line


def test_the_synthesize_command_writes_rows_progress_and_resumes(tmp_path):
    out = tmp_path / "c.jsonl"
    args = ["synthesize", "--recipe", "e5-mistral", "-o", str(out), "--shard-size", "10", "--generator", "tiny:4"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "rows/s" in first.output and "acceptance" in first.output and "ETA" in first.output
    log = (tmp_path / "c.jsonl.parts" / "progress.log").read_text()
    assert "rows/s" in log
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0 and "resuming: " in second.output
    assert out.read_text().count("\n") == json.loads((tmp_path / "c.jsonl.stats.json").read_text())["rows"]


def test_an_unknown_recipe_is_one_clean_line(tmp_path):
    result = CliRunner().invoke(app, ["synthesize", "--recipe", "nope", "-o", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2
    assert "synthesis recipe 'nope'" in result.output and "e5-mistral" in result.output


def test_a_budget_is_refused_on_ray_where_each_worker_would_count_its_own(tmp_path):
    argv = ["synthesize", "--recipe", "e5-mistral", "-o", str(tmp_path / "o.jsonl"), "--max-requests", "5"]
    endpoint = ["--generator", "http://127.0.0.1:9/v1"]  # a budget counts an endpoint's requests
    result = CliRunner().invoke(app, [*argv, *endpoint, "--engine", "ray"])
    assert result.exit_code == 2 and "Invalid value for --max-requests" in result.output
    assert "budget is counted in" in result.output and not (tmp_path / "o.jsonl.parts").exists()


def test_options_the_generator_does_not_read_are_refused(tmp_path):
    """--max-requests, --model or --device with the tiny generator (or --device with an endpoint) changed nothing."""
    argv = ["synthesize", "--recipe", "e5-mistral", "-o", str(tmp_path / "o.jsonl")]
    for extra, flag in (
        (["--max-requests", "1", "--device", "cuda:7"], "--max-requests"),
        (["--generator", "http://127.0.0.1:9/v1", "--device", "cuda:7"], "--device"),
        (["--generator", "local:minilm", "--concurrency", "9"], "--concurrency"),
    ):
        result = CliRunner().invoke(app, [*argv, *extra])
        assert result.exit_code == 2 and f"Invalid value for {flag}" in result.output, result.output
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize(
    ("row", "count_too", "said"),
    [
        ('{"query": "q", "positive": "p"}', False, r"shard-00000\.jsonl: 7 rows; \S+ records 6 \(rows\)"),
        ("[1, 2]", True, r"shard-00000\.jsonl:7: a row is a JSON object, not list"),
        ("not json", True, r"shard-00000\.jsonl:7: not a JSON row"),
    ],
)
def test_a_row_added_to_a_finished_shard_and_resealed_is_refused(tmp_path, row, count_too, said):
    """A row appended to a shard, its sha256 rewritten in the shard's record, went into the output (7 rows of 6
    attempted); the row count the record keeps, and each row being a JSON object, are now checked too."""
    import hashlib

    out = tmp_path / "out.jsonl"
    with pytest.raises(_Killed):
        synthesize("e5-mistral", _DiesAfter(3), out, shard_size=6)
    parts = out.with_name("out.jsonl.parts")
    shard, record = parts / "shard-00000.jsonl", parts / "shard-00000.stats.json"
    shard.write_text(shard.read_text() + row + "\n")
    stats = json.loads(record.read_text())
    stats["files"]["shard-00000.jsonl"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    stats["rows"] += 1 if count_too else 0
    record.write_text(json.dumps(stats))
    with pytest.raises(ShardError, match=said):
        synthesize("e5-mistral", _DiesAfter(None), out, shard_size=6)
    assert not out.exists()
