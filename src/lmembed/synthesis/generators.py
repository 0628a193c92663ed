"""Text generators behind one interface: a local Hugging Face causal LM, any OpenAI-compatible endpoint, and a
deterministic tiny generator for tests.

A :class:`Generator` answers chat requests (:meth:`Generator.generate`) and, where it can, scores text by the
log-probability the model gives it (:meth:`Generator.loglikelihood`: ``log p(continuation | context)``, the
query likelihood Gecko relabels with). A generator that cannot score (most endpoints return no prompt
log-probabilities) raises :class:`ScoringUnsupported`, and a recipe falls back to what it can still do.

=========================== ==========================================================================
class                       what it runs
=========================== ==========================================================================
:class:`LocalGenerator`     transformers generation: batched, left-padded, chat template, KV cache
:class:`EndpointGenerator`  ``/v1/chat/completions`` of vLLM, TGI, llama.cpp, ``transformers serve``, a
                            hosted API: a concurrency limit, retries with backoff on 429/5xx, a request
                            and token budget, the API key read from an environment variable; scores
                            through ``/v1/completions`` (``echo`` + ``logprobs``) where the server gives
                            prompt log-probabilities
:class:`TinyGenerator`      a seeded, deterministic stand-in that answers in the requested JSON shape
                            (and, when asked, malformed) for tests
=========================== ==========================================================================
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from lmembed.errors import LmembedError

log = logging.getLogger(__name__)

Message = dict[str, str]


class GeneratorError(LmembedError, RuntimeError):
    """A generator cannot answer: a refused API key, an unreachable server, a spent budget, retries used up.
    ``status``: the HTTP status of an endpoint's final answer, where there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ScoringUnsupported(LmembedError, NotImplementedError):
    """The generator gives no log-probabilities for given text (an endpoint without prompt logprobs)."""


@dataclass(frozen=True)
class Request:
    """One chat request: the messages, and the shape the answer should take (``json_keys``: a JSON object with
    these keys; ``json_list``: a JSON list of strings), used by generators that can constrain or imitate it."""

    messages: tuple[Message, ...]
    json_keys: tuple[str, ...] = ()
    json_list: bool = False
    max_new_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0


@dataclass
class Usage:
    """What a generator has spent: requests, prompt and completion tokens (as the server or tokenizer counts)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    #: answers the server stopped at the request's token limit (``finish_reason: "length"``): a JSON answer cut
    #: there fails to parse, and this says why (raise the recipe's ``max_new_tokens``)
    cut_at_limit: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(vars(self))


class Generator(Protocol):
    """What a recipe needs from a language model."""

    #: a short description for provenance, e.g. ``local:smollm2-135m``
    name: str
    usage: Usage

    def generate(self, requests: Sequence[Request]) -> list[str]:
        """The text answer to each request, in order."""
        ...

    def loglikelihood(self, contexts: Sequence[str], continuations: Sequence[str]) -> list[float]:
        """``log p(continuation | context)`` summed over the continuation's tokens; :class:`ScoringUnsupported`
        if the generator cannot say."""
        ...

    def yes_probability(self, prompts: Sequence[str]) -> list[float]:
        """p("yes") / (p("yes") + p("no")) for the next word after each prompt."""
        ...


# ---------------------------------------------------------------------------------------------------- tiny


_TINY_WORDS = (
    "alpha",
    "beta",
    "gamma",
    "delta",
    "river",
    "stone",
    "light",
    "cell",
    "protein",
    "model",
    "signal",
    "ocean",
    "forest",
    "energy",
    "vector",
    "query",
    "market",
    "city",
    "storm",
    "garden",
    "memory",
    "theory",
)


@dataclass
class TinyGenerator:
    """A deterministic generator for tests: the answer is a pure function of the request and ``seed``. It answers
    in the requested JSON shape with words drawn from the prompt (so a query shares words with its passage);
    ``malformed_rate`` of the answers are broken on purpose (cut short, a key missing, not JSON at all)."""

    seed: int = 0
    malformed_rate: float = 0.0
    name: str = "tiny"
    usage: Usage = field(default_factory=Usage)

    def _rng(self, *parts: str) -> random.Random:
        digest = hashlib.sha256("\x1f".join((str(self.seed), *parts)).encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def generate(self, requests: Sequence[Request]) -> list[str]:
        return [self._answer(request) for request in requests]

    def _answer(self, request: Request) -> str:
        self.usage.requests += 1
        prompt = "\n".join(m["content"] for m in request.messages)
        rng = self._rng(prompt, str(request.seed))
        words = [w for w in re.findall(r"[a-z]{4,}", prompt.lower())] or _TINY_WORDS

        def phrase(n: int) -> str:
            return " ".join(rng.choice(words) for _ in range(n))

        if request.json_list:
            text = json.dumps([f"Retrieve {phrase(4)} for {phrase(3)}" for _ in range(rng.randint(2, 4))])
        elif request.json_keys:
            text = json.dumps({key: phrase(rng.randint(3, 9)) for key in request.json_keys})
        else:
            text = phrase(8)
        if rng.random() < self.malformed_rate:
            text = rng.choice([text[: len(text) // 2], "I cannot help with that.", _drop_key(text)])
        self.usage.completion_tokens += len(text.split())
        return text

    def loglikelihood(self, contexts: Sequence[str], continuations: Sequence[str]) -> list[float]:
        """A made-up but monotone likelihood: continuation words seen in the context are likely."""
        scores = []
        for context, continuation in zip(contexts, continuations, strict=True):
            seen = set(context.lower().split())
            words = continuation.lower().split() or [""]
            scores.append(sum(-0.5 if w in seen else -6.0 for w in words))
        return scores

    def yes_probability(self, prompts: Sequence[str]) -> list[float]:
        out = []
        for prompt in prompts:
            query, _, passage = prompt.partition("\n")
            q, p = set(query.lower().split()), set(passage.lower().split())
            out.append(len(q & p) / max(1, len(q)))
        return out


def _drop_key(text: str) -> str:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text
    if isinstance(data, dict) and data:
        data.pop(next(iter(data)))
    return json.dumps(data)


# --------------------------------------------------------------------------------------------------- local


class _RowSampler:
    """A logits processor that makes each row's next token its own request's: greedy at temperature 0, else
    drawn at the request's temperature from a generator seeded with the request's seed (the drawn token is left
    the only one greedy decoding can pick). A request's answer then depends on its own seed, not on which
    requests share its batch nor on ``batch_size`` (one global seed per batch, the first request's, made it
    depend on both)."""

    def __init__(self, requests: Sequence[Request], device: Any) -> None:
        import torch

        self.temperatures = [r.temperature for r in requests]
        self.generators = [
            torch.Generator(device=device).manual_seed(r.seed) if r.temperature > 0 else None for r in requests
        ]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        out = scores
        for row, (temperature, generator) in enumerate(zip(self.temperatures, self.generators, strict=True)):
            if generator is None:
                continue
            probs = torch.softmax(scores[row].float() / temperature, dim=-1)
            token = torch.multinomial(probs, 1, generator=generator)
            if out is scores:
                out = scores.clone()
            out[row] = float("-inf")
            out[row, token] = 0.0
        return out


class LocalGenerator:
    """A Hugging Face causal LM run in this process: requests are batched, left-padded, wrapped in the
    tokenizer's chat template, and decoded with the KV cache (greedy at temperature 0, else sampled)."""

    def __init__(self, model: str, *, device: str = "cpu", dtype: str = "float32", batch_size: int = 8) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from lmembed.models.loading import check_local_model, load_tokenizer, resolve_dtype, resolve_model_path
        from lmembed.models.weights import pretrained_safely

        self._arguments = {"model": model, "device": device, "dtype": dtype, "batch_size": batch_size}
        path = resolve_model_path(model)
        self.name = f"local:{model}" if dtype == "float32" else f"local:{model}@{dtype}"
        self.usage = Usage()
        self.batch_size = batch_size
        self.device = torch.device(device)
        check_local_model(path)  # a folder from elsewhere: links and sizes before anything is read
        self.tokenizer = load_tokenizer(path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        config = AutoConfig.from_pretrained(path)
        model = pretrained_safely(AutoModelForCausalLM, path, config=config, dtype=resolve_dtype(dtype))
        self.model = model.to(self.device).eval()
        self._torch = torch

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as its arguments (a transformers model does not pickle): a Ray worker loads the model itself."""
        return dict(self._arguments)

    def __setstate__(self, arguments: dict[str, Any]) -> None:
        self.__init__(**arguments)  # type: ignore[misc]

    def _chat(self, messages: Sequence[Message]) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        return "\n\n".join(m["content"] for m in messages) + "\n\n"

    def generate(self, requests: Sequence[Request]) -> list[str]:
        # batches of similar prompt length pad less (the prompt's forward pass is most of a short answer's cost)
        order = sorted(range(len(requests)), key=lambda i: sum(len(m["content"]) for m in requests[i].messages))
        out: list[str] = [""] * len(requests)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            for i, answer in zip(chunk, self._generate_batch([requests[i] for i in chunk]), strict=True):
                out[i] = answer
        return out

    def _generate_batch(self, requests: Sequence[Request]) -> list[str]:
        torch = self._torch
        from transformers import LogitsProcessorList

        texts = [self._chat(r.messages) for r in requests]
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        with torch.inference_mode():
            ids = self.model.generate(
                **batch,
                max_new_tokens=max(r.max_new_tokens for r in requests),
                do_sample=False,  # sampled rows draw in the processor, each from its own seeded generator
                logits_processor=LogitsProcessorList([_RowSampler(requests, self.device)]),
                top_p=None,
                top_k=None,
                temperature=None,
                use_cache=True,
                pad_token_id=self.tokenizer.pad_token_id,
            )
        new = ids[:, batch["input_ids"].shape[1] :]
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        # each answer within its own request's limit (the batch runs to the largest)
        rows = [row[: request.max_new_tokens] for row, request in zip(new.tolist(), requests, strict=True)]
        self.usage.requests += len(requests)
        self.usage.prompt_tokens += int(batch["attention_mask"].sum())
        self.usage.completion_tokens += sum(token != pad for row in rows for token in row)
        for row, request in zip(rows, requests, strict=True):  # no end of text within its own limit: cut
            if len(row) >= request.max_new_tokens and eos not in row:
                self.usage.cut_at_limit += 1
        return [t.strip() for t in self.tokenizer.batch_decode(rows, skip_special_tokens=True)]

    def loglikelihood(self, contexts: Sequence[str], continuations: Sequence[str]) -> list[float]:
        torch = self._torch
        scores: list[float] = []
        for context, continuation in zip(contexts, continuations, strict=True):
            ctx = self.tokenizer(context, add_special_tokens=False)["input_ids"]
            cont = self.tokenizer(" " + continuation.strip(), add_special_tokens=False)["input_ids"]
            ids = torch.tensor([ctx + cont], device=self.device)
            with torch.inference_mode():
                logits = self.model(ids).logits[0, len(ctx) - 1 : -1].float()
            logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(cont, device=self.device)[:, None])
            scores.append(float(logp.sum()))
        return scores

    def yes_probability(self, prompts: Sequence[str]) -> list[float]:
        torch = self._torch
        yes = self.tokenizer(" yes", add_special_tokens=False)["input_ids"][0]
        no = self.tokenizer(" no", add_special_tokens=False)["input_ids"][0]
        out = []
        for prompt in prompts:
            ids = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(self.device)
            with torch.inference_mode():
                logits = self.model(ids).logits[0, -1].float()
            pair = torch.softmax(logits[[yes, no]], -1)
            out.append(float(pair[0]))
        return out


# ------------------------------------------------------------------------------------------------ endpoint


@dataclass
class Budget:
    """Limits on what an endpoint run may spend; ``None`` is no limit."""

    max_requests: int | None = None
    max_tokens: int | None = None


class EndpointGenerator:
    """Any OpenAI-compatible ``/v1/chat/completions``: ``concurrency`` requests in flight, each retried with
    exponential backoff on 429, 5xx and dropped connections (``retries`` times), within a :class:`Budget`.
    The key is read from the environment variable ``api_key_env`` (none sent when it is unset).

    :meth:`loglikelihood` asks ``/v1/completions`` to echo the prompt with its tokens' log-probabilities (OpenAI's
    legacy API, vLLM); a server without that route, or one that answers without them (``transformers serve``,
    most chat-only servers), makes it raise :class:`ScoringUnsupported`, and it is not asked again."""

    RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
    #: a final answer with one of these to ``/v1/completions`` means: no scoring here (not: the server is broken)
    NO_SCORING_STATUS = frozenset({400, 404, 405, 422, 501})

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        concurrency: int = 4,
        retries: int = 4,
        backoff: float = 0.5,
        timeout: float = 60.0,
        budget: Budget | None = None,
    ) -> None:
        import httpx

        self._arguments = {
            "base_url": base_url,
            "model": model,
            "api_key_env": api_key_env,
            "concurrency": concurrency,
            "retries": retries,
            "backoff": backoff,
            "timeout": timeout,
            "budget": budget,
        }
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model = model
        self.name = f"endpoint:{model}@{base_url}"
        self.usage = Usage()
        self.concurrency = max(1, concurrency)
        self.retries = retries
        self.backoff = backoff
        self.budget = budget or Budget()
        self._lock = threading.Lock()
        key = os.environ.get(api_key_env)
        self._secret = key or None  # redacted from every message this generator raises or logs
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)
        self._httpx = httpx
        self._no_scoring: str | None = None  # why the endpoint gives no prompt log-probabilities, once known

    def close(self) -> None:
        self._client.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as its arguments, not its connections or its key: a Ray worker opens its own client and reads
        the key from its own environment (a local cluster's workers inherit this process's)."""
        return dict(self._arguments)

    def __setstate__(self, arguments: dict[str, Any]) -> None:
        self.__init__(**arguments)  # type: ignore[misc]

    def generate(self, requests: Sequence[Request]) -> list[str]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self._one, requests))

    def _payload(self, request: Request) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": list(request.messages),
            "max_tokens": request.max_new_tokens,
            "temperature": request.temperature,
            "seed": request.seed,
        }
        return payload

    def _spend(self) -> None:
        with self._lock:
            limit, tokens = self.budget, self.usage.prompt_tokens + self.usage.completion_tokens
            if limit.max_requests is not None and self.usage.requests >= limit.max_requests:
                raise GeneratorError(f"request budget spent: {self.usage.requests} of {limit.max_requests} requests")
            if limit.max_tokens is not None and tokens >= limit.max_tokens:
                raise GeneratorError(f"token budget spent: {tokens} of {limit.max_tokens} tokens")
            self.usage.requests += 1

    def _one(self, request: Request) -> str:
        body = self._post("chat/completions", self._payload(request))
        try:
            choice = body["choices"][0]
            text = str(choice["message"]["content"] or "")
        except (KeyError, IndexError, TypeError) as exc:
            raise GeneratorError(f"{self.base_url}/chat/completions: answer has no choices[0].message.content") from exc
        if isinstance(choice, dict) and choice.get("finish_reason") == "length":
            with self._lock:
                self.usage.cut_at_limit += 1
        return text

    def _post(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/{route}"
        self._spend()
        for attempt in range(self.retries + 1):
            last = self._attempt(url, payload)
            if isinstance(last, dict):
                usage = last.get("usage") or {}
                with self._lock:
                    self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                    self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
                return last
            if attempt < self.retries:
                with self._lock:
                    self.usage.retries += 1
                delay = self.backoff * 2**attempt * (1 + random.random() / 4)
                log.info("%s: %s; retry %d in %.2fs", url, redact(last, self._secret), attempt + 1, delay)
                time.sleep(delay)
        raise GeneratorError(redact(f"{url}: gave up after {self.retries + 1} tries: {last}", self._secret))

    def _attempt(self, url: str, payload: dict[str, Any]) -> dict[str, Any] | str:
        """The answer's JSON, or why it is worth another try (a fatal answer raises)."""
        httpx = self._httpx
        try:
            response = self._client.post(url, json=payload)
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.TimeoutException) as exc:
            return f"cannot reach the server ({type(exc).__name__}: {exc})"
        if response.status_code in self.RETRY_STATUS:
            return f"HTTP {response.status_code}"
        status = response.status_code
        detail = _detail(response, self._secret) if status >= 400 else ""
        if status in (401, 403):
            raise GeneratorError(f"{url}: HTTP {status}: the API key was refused ({detail})", status)
        if status >= 400:
            raise GeneratorError(f"{url}: HTTP {status}: {detail}", status)
        try:
            return response.json()
        except ValueError as exc:
            raise GeneratorError(f"{url}: the answer is not JSON") from exc

    def loglikelihood(self, contexts: Sequence[str], continuations: Sequence[str]) -> list[float]:
        """``log p(" " + continuation | context)``: the sum of the echoed prompt's log-probabilities over the tokens
        that end after the context (the local generator scores the same text)."""
        if self._no_scoring:
            raise ScoringUnsupported(self._no_scoring)
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self._prompt_logprob, contexts, continuations))

    def _unsupported(self, reason: str) -> ScoringUnsupported:
        self._no_scoring = f"{self.name}: {reason}"
        return ScoringUnsupported(self._no_scoring)

    def _prompt_logprob(self, context: str, continuation: str) -> float:
        if self._no_scoring:
            raise ScoringUnsupported(self._no_scoring)
        prompt = context + " " + continuation.strip()
        payload = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "echo": True}
        try:
            body = self._post("completions", {**payload, "logprobs": 1})
        except GeneratorError as exc:
            if exc.status in self.NO_SCORING_STATUS:
                raise self._unsupported(
                    f"/v1/completions answered HTTP {exc.status}, no prompt log-probabilities"
                ) from exc
            raise
        choice = (body.get("choices") or [{}])[0]
        logprobs = choice.get("logprobs") or {}
        values, offsets = logprobs.get("token_logprobs"), logprobs.get("text_offset")
        if not values or not offsets or len(values) != len(offsets):
            raise self._unsupported("/v1/completions returned no prompt log-probabilities (echo + logprobs)")
        ends = [*offsets[1:], len(prompt)]
        picked = [
            v for start, end, v in zip(offsets, ends, values, strict=True) if end > len(context) and start < len(prompt)
        ]
        if not picked or any(v is None for v in picked):
            raise self._unsupported("/v1/completions echoed the prompt without its tokens' log-probabilities")
        return float(sum(picked))

    def yes_probability(self, prompts: Sequence[str]) -> list[float]:
        """From the first answer token's ``top_logprobs`` when the endpoint gives them, else from the answer's
        text (1.0 for yes, 0.0 otherwise)."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self._yes, prompts))

    def _yes(self, prompt: str) -> float:
        payload = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 1,
            "temperature": 0.0,
            "logprobs": True,
            "top_logprobs": 10,
        }
        choice = (self._post("chat/completions", payload).get("choices") or [{}])[0]
        content = ((choice.get("logprobs") or {}).get("content") or [{}])[0]
        probs = {"yes": 0.0, "no": 0.0}
        for item in content.get("top_logprobs") or []:
            word = str(item.get("token", "")).strip().lower()
            if word in probs:
                probs[word] += math.exp(float(item.get("logprob", -math.inf)))
        if probs["yes"] + probs["no"] > 0:
            return probs["yes"] / (probs["yes"] + probs["no"])
        text = str((choice.get("message") or {}).get("content") or "").strip().lower()
        return 1.0 if text.startswith("yes") else 0.0


REDACTED = "[redacted]"


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` (the user's API key) replaced, wherever a server or a library put it."""
    return text.replace(secret, REDACTED) if secret else text


def _detail(response: Any, secret: str | None = None) -> str:
    """What an error answer says, the key redacted before it is cut to 200 characters (so no part of it shows)."""
    try:
        body = response.json()
    except ValueError:
        return redact(response.text, secret)[:200]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return redact(str(error.get("message", error)), secret)[:200]
    return redact(json.dumps(body), secret)[:200]


#: The options :func:`build_generator` reads (each kind takes its own; the others are ignored).
GENERATOR_OPTIONS = frozenset(
    {"model", "api_key_env", "concurrency", "retries", "backoff", "timeout", "budget"}
    | {"device", "dtype", "batch_size", "malformed_rate"}
)


def _tiny_seed(spec: str) -> int:
    """The seed of ``tiny:SEED`` (``tiny``: 0); another text after ``tiny:`` is a :class:`GeneratorError`."""
    text = spec.partition(":")[2]
    if not text:
        return 0
    if not text.isdigit():
        raise GeneratorError(f"generator {spec!r}: the seed after 'tiny:' must be a whole number >= 0, got {text!r}")
    return int(text)


def check_generator(spec: str, *, models: bool = True) -> None:
    """Refuse a generator ``spec`` that :func:`build_generator` cannot use, before anything loads: ``tiny:SEED``
    with a whole-number seed, an endpoint URL, or ``local:MODEL`` (``MODEL`` alone) naming a bundled model, a model
    folder or a Hub id (``models=False``: the spec's form only, nothing looked up). Raises :class:`GeneratorError`
    naming the spec."""
    if spec == "tiny" or spec.startswith("tiny:"):
        _tiny_seed(spec)
        return
    if spec.startswith(("http://", "https://")) or (not models and spec.removeprefix("local:")):
        return
    from lmembed.models.loading import check_model_name  # lazy: torch loads only when a model does

    model = spec.removeprefix("local:")
    if not model:
        raise GeneratorError(f"generator {spec!r} names no model (tiny[:SEED], local:MODEL or http(s)://HOST/v1)")
    try:
        check_model_name(model)
    except LmembedError as exc:
        raise GeneratorError(f"generator {spec!r}: {exc}") from exc


def build_generator(spec: str, **options: Any) -> Generator:
    """``tiny`` / ``tiny:SEED``, ``local:MODEL`` (a bundled name, a folder, a Hub id), or an endpoint URL
    (``http://host:port/v1``, with ``model=`` in the options)."""
    if spec == "tiny" or spec.startswith("tiny:"):
        return TinyGenerator(seed=_tiny_seed(spec), malformed_rate=float(options.get("malformed_rate", 0.0)))
    if spec.startswith(("http://", "https://")):
        keys = ("api_key_env", "concurrency", "retries", "backoff", "timeout", "budget")
        return EndpointGenerator(
            spec, options.get("model") or "default", **{k: options[k] for k in keys if k in options}
        )
    model = spec.removeprefix("local:")
    keys = ("device", "dtype", "batch_size")
    return LocalGenerator(model, **{k: options[k] for k in keys if k in options})
