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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from lmembed.config import EmbeddingConfig
from lmembed.encoding.engine import EncodingEngine
from lmembed.encoding.inputs import Features
from lmembed.errors import InputError
from lmembed.serving.errors import ApiError, bad_request

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

    async def features(self, texts: Sequence[str], instruction: str | None, field: str = "input") -> list[Features]:
        if self.closed:
            raise ApiError(503, "the server is shutting down", "shutting_down")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.build, texts, instruction, field)

    def close(self) -> None:
        self.closed = True
        self.executor.shutdown(wait=True)
