"""The endpoint generator against a real ``transformers serve``, offline, on a free loopback port.

The server serves a tiny random Llama saved to a temporary folder: the word-level test tokenizer (its
``model_input_names`` without ``token_type_ids``, which generation refuses) with a chat template, and a generation
config whose ``sequence_bias`` makes the model answer one JSON object and stop, so that a recipe's answers parse.
``transformers serve`` answers ``/v1/chat/completions`` and ``/v1/completions`` but ignores ``logprobs``/``echo``:
the endpoint generator's query-likelihood scoring is unsupported there, and a Gecko run relabels by relevance
alone and says so. One server serves the module; it is always stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from conftest import build_tokenizer, tiny_decoder_config
from lmembed.synthesis.gecko import RELEVANCE_ONLY
from lmembed.synthesis.generators import EndpointGenerator, Request, ScoringUnsupported
from lmembed.synthesis.synthesize import synthesize
from test_relabel_recipes import IDS, TOPICS, encode
from test_synthesize import _free_port

ANSWER = '{"task": "find the study of the cell", "query": "protein gene cell"}'
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
STARTUP_S = 120  # import and model load; about 10 s on an idle 2-core machine, more when it is shared


def save_steered_tiny_llama(folder: Path) -> None:
    """A tiny random Llama whose greedy answer is :data:`ANSWER` (one vocabulary entry) then end-of-sequence."""
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = build_tokenizer()
    inner = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    inner.add_tokens([ANSWER])  # decoded as it is written; never produced by encoding a prompt's words
    tok = PreTrainedTokenizerFast(
        tokenizer_object=inner, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]"
    )
    tok.model_input_names = ["input_ids", "attention_mask"]  # generate() refuses token_type_ids
    tok.chat_template = TEMPLATE
    answer, eos = tok.convert_tokens_to_ids(ANSWER), tok.eos_token_id
    config = tiny_decoder_config("llama", len(tok))
    config.eos_token_id, config.bos_token_id = eos, tok.bos_token_id
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=eos,
        pad_token_id=0,
        do_sample=False,
        # the list form: a dict's tuple keys do not survive generation_config.json
        sequence_bias=[[[answer], 100.0], [[answer, eos], 1000.0]],
    )
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(base_url, model)`` of a running ``transformers serve``; stopped when the module's tests are done."""
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        pytest.skip("transformers serve needs fastapi, uvicorn, pydantic and openai (pip install -e '.[serve]')")
    folder = tmp_path_factory.mktemp("steered-tiny-llama")
    save_steered_tiny_llama(folder)
    port = _free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",  # the CLI otherwise asks PyPI for a newer version
        "OMP_NUM_THREADS": "1",
    }
    log = folder / "serve.log"
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(folder)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32"]
    with log.open("wb") as handle:
        proc = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not answer /health in {STARTUP_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1", str(folder)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_chat_completions_through_the_endpoint_generator(served):
    url, model = served
    gen = EndpointGenerator(url, model, concurrency=2, retries=0)
    asks = [Request(({"role": "user", "content": text},), max_new_tokens=8) for text in ("the cat sat", "a dog")]
    assert gen.generate(asks) == [ANSWER, ANSWER]
    assert gen.usage.requests == 2 and gen.usage.prompt_tokens > 0 and gen.usage.completion_tokens > 0
    gen.close()


def test_completions_answer_but_give_no_prompt_logprobs_so_scoring_is_unsupported(served):
    url, model = served
    plain = httpx.post(f"{url}/completions", json={"model": model, "prompt": "the cat", "max_tokens": 2}, timeout=60)
    assert plain.status_code == 200 and isinstance(plain.json()["choices"][0]["text"], str)
    gen = EndpointGenerator(url, model, retries=0)
    with pytest.raises(ScoringUnsupported, match="/v1/completions returned no prompt log-probabilities"):
        gen.loglikelihood(["Passage: the cat sat\nA query:"], ["cat"])
    gen.close()


def test_a_gecko_run_relabels_by_relevance_alone_and_says_so(served, tmp_path):
    url, model = served
    gen = EndpointGenerator(url, model, concurrency=2, retries=0)
    corpus = (IDS[:4], TOPICS[:4])
    stats = synthesize("gecko", gen, tmp_path / "gecko.jsonl", corpus=corpus, encode=encode, shard_size=2)
    gen.close()
    assert stats["rows"] == stats["attempted"] == 4 and stats["rejected"] == {}
    rows = [json.loads(line) for line in (tmp_path / "gecko.jsonl").read_text().splitlines()]
    assert {row["query"] for row in rows} == {"protein gene cell"}
    assert all(row["provenance"]["relabel"] == RELEVANCE_ONLY for row in rows)
    assert all(row["provenance"]["generator"] == f"endpoint:{model}@{url}" for row in rows)
    note, fallback = stats["notes"]  # relevance alone, and all equal here: the retriever's order is kept, and said
    assert RELEVANCE_ONLY in note and "returned no prompt log-probabilities" in note
    assert "retriever-order" in fallback
