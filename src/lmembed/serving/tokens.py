"""Request texts tokenised once, off the event loop.

A request's texts are tokenised exactly as the encoding engine tokenises them (the engine's own
:meth:`~lmembed.encoding.engine.EncodingEngine.input_builder`: instruction, echo template, special tokens,
truncation), in one batched call, on one worker thread with a private copy of the tokenizer (a fast tokenizer
must not be used from two threads at once). The features built here are what the forward pass runs on (the
batcher hands them to ``encode_raw(..., features=...)``), so no text is tokenised twice; their lengths give
``usage.prompt_tokens``, the token budget of each forward pass, and, with truncation off, the over-length check.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from lmembed.config import EmbeddingConfig
from lmembed.encoding.engine import EncodingEngine
from lmembed.encoding.inputs import Features
from lmembed.errors import InputError
from lmembed.serving.errors import ApiError, bad_request

T = TypeVar("T")

#: A length bound no text reaches: what the over-length check tokenises with.
UNBOUNDED = 1 << 30


class RequestTokenizer:
    """Builds the features of request texts (and refuses over-long texts when truncation is off) on its own
    thread."""

    def __init__(self, engine: EncodingEngine, config: EmbeddingConfig, *, truncate: bool = True) -> None:
        tokenizer = copy.deepcopy(engine.backbone.tokenizer)
        self.builder = engine.input_builder(config, tokenizer)
        self.max_length = self.builder.max_length
        self.unbounded = None if truncate else engine.input_builder(config, tokenizer, UNBOUNDED)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmembed-tokenize")
        self.closed = False

    def build(self, texts: Sequence[str], instruction: str | None, field: str = "input") -> list[Features]:
        """Each text's features, as the model is fed them (after truncation)."""
        try:
            features = self.builder.build_all(texts, instruction)
            if self.unbounded is not None:
                full = self.unbounded.build_all(texts, instruction)
                for i, (cut, whole) in enumerate(zip(features, full, strict=True)):
                    if len(whole) > len(cut):
                        raise bad_request(
                            f"'{field}[{i}]' is {len(whole)} tokens long; the model reads at most {self.max_length} "
                            "and this server does not truncate (--no-truncate)",
                            "input_too_long",
                            field,
                        )
        except InputError as exc:
            raise bad_request(str(exc), "invalid_input", field) from None
        return features

    def split(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
        """Each text's tokens as the model's tokenizer splits it (TEI's ``/tokenize``): no instruction and no cut,
        but with the special tokens the model reads, the end-of-sequence token lmembed appends included."""
        tokenizer = self.builder.tokenizer
        fast = getattr(tokenizer, "is_fast", False)
        batch = tokenizer(
            list(texts), add_special_tokens=add_special_tokens, return_offsets_mapping=fast, truncation=False
        )
        special_ids = set(tokenizer.all_special_ids)
        out = []
        for i, (text, ids) in enumerate(zip(texts, batch["input_ids"], strict=True)):
            ids = list(ids)
            spans = list(batch["offset_mapping"][i]) if fast else [None] * len(ids)
            eos = self.builder.eos_id
            if add_special_tokens and eos is not None and (not ids or ids[-1] != eos):
                ids.append(eos)
                spans.append(None)
            pieces = tokenizer.convert_ids_to_tokens(ids)
            tokens = []
            for token_id, piece, span in zip(ids, pieces, spans, strict=True):
                special = token_id in special_ids or span is None
                start, stop = (None, None) if special else span
                shown = text[start:stop] if start is not None else piece
                tokens.append({"id": token_id, "text": shown, "special": special, "start": start, "stop": stop})
            out.append(tokens)
        return out

    def decode(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
        return self.builder.tokenizer.batch_decode(list(ids), skip_special_tokens=skip_special_tokens)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the tokenizer's own thread (the one that may use its tokenizer)."""
        if self.closed:
            raise ApiError(503, "the server is shutting down", "shutting_down")
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def features(self, texts: Sequence[str], instruction: str | None, field: str = "input") -> list[Features]:
        return await self.run(self.build, texts, instruction, field)

    def close(self) -> None:
        self.closed = True
        self.executor.shutdown(wait=True)
