"""The local transformers generator on a tiny random Llama with a chat template, and the tiny generator."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import build_tokenizer, tiny_decoder_config
from lmembed.synthesis.generators import LocalGenerator, Request, TinyGenerator, build_generator

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TEMPLATE
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_decoder_config("llama", len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _ask(text: str) -> Request:
    return Request(({"role": "user", "content": text},), max_new_tokens=6)


def test_batched_left_padded_generation_matches_one_at_a_time(tiny_llama):
    gen = LocalGenerator(tiny_llama, batch_size=4)
    requests = [_ask("the protein model"), _ask("a long query about gene study result and language model search")]
    together = gen.generate(requests)
    alone = [gen.generate([r])[0] for r in requests]
    assert together == alone
    assert gen.usage.requests == 4 and gen.usage.completion_tokens > 0
    assert gen._chat(requests[0].messages).endswith("assistant:")  # the chat template is applied


def test_a_sampled_answer_depends_on_its_own_seed_not_on_its_batch(tiny_llama):
    """A batch was sampled from one seed, its first request's: a request's answer changed with the requests
    beside it and with ``batch_size``, and a shorter limit was exceeded when a longer request shared the batch."""

    def ask(text: str, seed: int, limit: int = 8) -> Request:
        return Request(({"role": "user", "content": text},), max_new_tokens=limit, temperature=1.0, seed=seed)

    requests = [ask("the protein model", 1), ask("gene study result", 2), ask("a language model search", 3, 2)]
    batched = LocalGenerator(tiny_llama, batch_size=4).generate(requests)
    alone = LocalGenerator(tiny_llama, batch_size=1)
    assert batched == [alone.generate([r])[0] for r in requests]
    assert batched[1] == alone.generate([requests[1], ask("something else entirely", 9)])[0]
    reseeded = [alone.generate([ask("the protein model", seed)])[0] for seed in range(4)]
    assert len(set(reseeded)) > 1  # sampled, not greedy
    ids = alone.tokenizer(batched[2], add_special_tokens=False)["input_ids"]
    assert len(ids) <= 2  # its own limit, though it shared a batch with limits of 8


def test_local_scores_are_log_probabilities(tiny_llama):
    gen = LocalGenerator(tiny_llama)
    ll = gen.loglikelihood(["the protein model", "the protein model"], ["gene", "gene study result"])
    assert all(math.isfinite(x) and x < 0 for x in ll)
    assert ll[1] < ll[0]  # more tokens, each with probability below one
    p = gen.yes_probability(["query: gene\npassage: gene study\nrelevant?"])
    assert 0.0 <= p[0] <= 1.0


def test_the_tiny_generator_is_deterministic_answers_in_shape_and_breaks_on_request():
    req = Request(({"role": "user", "content": "write about protein energy"},), json_keys=("query", "passage"))
    a, b = TinyGenerator(seed=1).generate([req]), TinyGenerator(seed=1).generate([req])
    assert a == b and set(json.loads(a[0])) == {"query", "passage"}
    assert TinyGenerator(seed=2).generate([req]) != a
    broken = TinyGenerator(malformed_rate=1.0).generate([req] * 5)
    assert all(not _is_complete(text) for text in broken)


def _is_complete(text: str) -> bool:
    try:
        return set(json.loads(text)) == {"query", "passage"}
    except (json.JSONDecodeError, TypeError):
        return False


def test_build_generator_reads_a_spec():
    assert build_generator("tiny:7").seed == 7
    assert build_generator("http://127.0.0.1:1/v1", model="m").name == "endpoint:m@http://127.0.0.1:1/v1"
