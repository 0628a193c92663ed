"""What lmembed prints stays safe: a key the user gave is redacted from every message whatever an endpoint sends
back (one that echoes the bearer token in its 401 body, or in a 500 body it retries on), and a closed pipe on
output (``lmembed serve --help | head -1``) ends quietly, without an internal error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from typer.testing import CliRunner

from lmembed.cli.app import app as cli
from lmembed.serving.server import BackgroundServer
from lmembed.synthesis import generators

KEY = "sk-live-0123456789abcdefSECRET"
REPO = Path(__file__).resolve().parents[2]


def echoing_endpoint(status: int, *, plain: bool = False) -> FastAPI:
    """An endpoint that answers every chat request with ``status`` and the Authorization header it got (``plain``:
    in a text body where the key straddles the 200 characters a message keeps of it)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        given = request.headers.get("authorization", "")
        if plain:
            return PlainTextResponse(f"denied: {'x' * 180} {given}", status_code=status)
        return JSONResponse({"error": {"message": f"bad token {given}", "token": given}}, status_code=status)

    return app


@pytest.mark.parametrize("plain", [False, True])
def test_an_echoed_key_is_redacted_from_lmembed_synthesize(tmp_path, monkeypatch, plain):
    monkeypatch.setenv("TEST_ECHO_KEY", KEY)
    with BackgroundServer(echoing_endpoint(401, plain=plain)) as server:
        args = ["synthesize", "--recipe", "e5-mistral", "-o", str(tmp_path / "rows.jsonl"), "--max-requests", "3"]
        args += ["--generator", server.url + "/v1", "--model", "m", "--api-key-env", "TEST_ECHO_KEY"]
        result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0
    assert "HTTP 401" in result.output and "[red" in result.output, result.output
    assert KEY[:4] not in result.output, result.output  # not even the part a cut message would keep


def test_an_echoed_key_is_redacted_after_retries(monkeypatch):
    monkeypatch.setenv("TEST_ECHO_KEY", KEY)
    with BackgroundServer(echoing_endpoint(400)) as server:
        gen = generators.EndpointGenerator(server.url, "m", api_key_env="TEST_ECHO_KEY", retries=0)
        with pytest.raises(generators.GeneratorError) as refused:
            gen.generate([generators.Request(messages=({"role": "user", "content": "hi"},))])
        gen.close()
    assert "[redacted]" in str(refused.value) and KEY not in str(refused.value)


def test_a_closed_pipe_ends_quietly():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for argv in (["serve", "--help"], ["--help"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmembed.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.read(10)
        proc.stdout.close()  # as `| head -c 10` does
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) in (0, 1)
        assert "internal error" not in err and "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_boundary_turns_a_broken_pipe_into_a_quiet_exit(capsys):
    import typer

    from lmembed.cli.boundary import guarded

    def write_to_a_closed_pipe() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(typer.Exit) as ended:
        guarded(None, write_to_a_closed_pipe)  # type: ignore[arg-type]
    assert ended.value.exit_code == 1
    assert capsys.readouterr().err == ""
