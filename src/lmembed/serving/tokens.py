"""Token counts of request texts, computed off the event loop.

A request's texts are tokenised exactly as the encoding engine will tokenise them (the same
:class:`~lmembed.encoding.inputs.InputBuilder`: instruction, echo template, special tokens, truncation), on
one worker thread with a private copy of the tokenizer (a fast tokenizer must not be used from two threads
at once). The counts give ``usage.prompt_tokens``, the token budget of each forward pass, and, with
truncation off, the over-length check.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from lmembed.config import EmbeddingConfig
from lmembed.encoding.engine import resolve_max_length
from lmembed.encoding.inputs import InputBuilder
from lmembed.errors import InputError
from lmembed.serving.errors import ApiError, bad_request

#: A length bound no text reaches: what the over-length check tokenises with.
UNBOUNDED = 1 << 30


class RequestTokenizer:
    """Counts tokens (and refuses over-long texts when truncation is off) on its own thread."""

    def __init__(self, backbone, config: EmbeddingConfig, *, truncate: bool = True) -> None:
        tokenizer = copy.deepcopy(backbone.tokenizer)
        self.max_length = resolve_max_length(backbone, config.max_length)
        self.builder = InputBuilder(tokenizer, config, is_decoder=backbone.is_decoder, max_length=self.max_length)
        self.unbounded = (
            None if truncate else InputBuilder(tokenizer, config, is_decoder=backbone.is_decoder, max_length=UNBOUNDED)
        )
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmembed-tokenize")
        self.closed = False

    def lengths(self, texts: Sequence[str], instruction: str | None, field: str = "input") -> list[int]:
        """Tokens each text is fed to the model with (after truncation)."""
        out = []
        try:
            for i, text in enumerate(texts):
                n = len(self.builder.build(text, instruction))
                if self.unbounded is not None:
                    full = len(self.unbounded.build(text, instruction))
                    if full > n:
                        raise bad_request(
                            f"'{field}[{i}]' is {full} tokens long; the model reads at most {self.max_length} "
                            "and this server does not truncate (--no-truncate)",
                            "input_too_long",
                            field,
                        )
                out.append(n)
        except InputError as exc:
            raise bad_request(str(exc), "invalid_input", field) from None
        return out

    async def count(self, texts: Sequence[str], instruction: str | None, field: str = "input") -> list[int]:
        if self.closed:
            raise ApiError(503, "the server is shutting down", "shutting_down")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.lengths, texts, instruction, field)

    def close(self) -> None:
        self.closed = True
        self.executor.shutdown(wait=True)
