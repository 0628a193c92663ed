"""A minimal real OpenAI-compatible server (FastAPI + uvicorn) for the endpoint generator's tests.

Run as ``python openai_server.py PORT``. It answers ``/v1/chat/completions`` with deterministic text in the
shape the prompt asks for (a JSON list, or a JSON object with the keys the prompt quotes), and for a one-token
request with ``logprobs`` it returns ``top_logprobs`` for "yes"/"no". The environment steers its failures:
``SERVER_KEY`` (the bearer key it accepts; 401 otherwise), ``FAIL_FIRST`` and ``FAIL_STATUS`` (the first N
requests fail with that status), ``DIE_AFTER`` (after answering N requests the process exits on the next one).
``/v1/completions`` answers only with ``COMPLETIONS=echo`` (404 otherwise): it echoes the prompt with made-up
log-probabilities for its tokens (each word with its leading spaces is a token: -0.5 when the word came earlier
in the prompt, else -4.0; the first has none), then the generated token's.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import sys
import threading

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

app = FastAPI()
state = {"served": 0, "failed": 0}
lock = threading.Lock()


def _answer(prompt: str) -> str:
    rng = random.Random(hashlib.sha256(prompt.encode()).digest())
    words = re.findall(r"[a-z]{4,}", prompt.lower()) or ["word"]

    def phrase(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    if "json list" in prompt.lower():
        return json.dumps([f"Retrieve {phrase(4)}" for _ in range(3)])
    keys = list(dict.fromkeys(re.findall(r'"(\w+)":', prompt)))
    if keys:
        return "```json\n" + json.dumps({k: phrase(6) for k in keys}) + "\n```"
    return phrase(8)


@app.post("/v1/chat/completions")
async def chat(request: Request) -> JSONResponse:
    key = os.environ.get("SERVER_KEY")
    if key and request.headers.get("authorization") != f"Bearer {key}":
        return JSONResponse({"error": {"message": "Incorrect API key provided"}}, status_code=401)
    with lock:
        if state["failed"] < int(os.environ.get("FAIL_FIRST", "0")):
            state["failed"] += 1
            return JSONResponse(
                {"error": {"message": "slow down"}}, status_code=int(os.environ.get("FAIL_STATUS", "429"))
            )
    with lock:
        if state["served"] >= int(os.environ.get("DIE_AFTER") or 10**9):
            os._exit(0)  # dies with the request unanswered: the client sees the connection drop
    body = await request.json()
    prompt = "\n".join(m["content"] for m in body["messages"])
    choice: dict = {"index": 0, "finish_reason": "stop"}
    if body.get("logprobs") and body.get("max_tokens") == 1:
        overlap = len(set(prompt.lower().split()))
        yes = -0.2 if overlap % 2 else -2.0
        choice["message"] = {"role": "assistant", "content": "yes" if yes > -1 else "no"}
        choice["logprobs"] = {
            "content": [
                {
                    "token": "yes",
                    "logprob": yes,
                    "top_logprobs": [{"token": "yes", "logprob": yes}, {"token": "no", "logprob": -1.0}],
                }
            ]
        }
    else:
        answer = _answer(prompt)
        limit = body.get("max_tokens")
        if isinstance(limit, int) and len(answer.split()) > limit:  # a "token" a word: cut as servers cut
            answer, choice["finish_reason"] = " ".join(answer.split()[:limit]), "length"
        choice["message"] = {"role": "assistant", "content": answer}
    text = choice["message"]["content"]
    with lock:
        state["served"] += 1
    response = JSONResponse(
        {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": body.get("model", "test"),
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())},
        }
    )
    return response


def echo_logprobs(prompt: str) -> dict:
    tokens = re.findall(r"\s*\S+", prompt)
    offsets, seen, values, at = [], set(), [], 0
    for token in tokens:
        offsets.append(at)
        word = token.strip().lower()
        values.append(None if at == 0 else (-0.5 if word in seen else -4.0))
        seen.add(word)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": values, "text_offset": offsets}


@app.post("/v1/completions")
async def completions(request: Request) -> JSONResponse:
    if os.environ.get("COMPLETIONS") != "echo":
        return JSONResponse({"error": {"message": "Not Found"}}, status_code=404)
    body = await request.json()
    prompt = body["prompt"]
    choice: dict = {"index": 0, "finish_reason": "length", "text": (prompt if body.get("echo") else "") + " word"}
    if body.get("echo") and body.get("logprobs") is not None:
        logprobs = echo_logprobs(prompt)
        for key, value in (("tokens", " word"), ("token_logprobs", -1.0), ("text_offset", len(prompt))):
            logprobs[key].append(value)  # the generated token follows the echoed prompt, as vLLM answers
        choice["logprobs"] = logprobs
    return JSONResponse({"id": "cmpl-test", "object": "text_completion", "choices": [choice]})


@app.get("/health")
async def health() -> dict:
    return {"ok": True}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
