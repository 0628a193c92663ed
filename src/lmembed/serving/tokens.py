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
from itertools import accumulate
from typing import Any, TypeVar

from lmembed.config import EmbeddingConfig
from lmembed.encoding.engine import EncodingEngine
from lmembed.encoding.inputs import Features
from lmembed.errors import InputError
from lmembed.serving.errors import ApiError, bad_request

T = TypeVar("T")

#: ``/tokenize`` tokenises a text whole only if this many characters a token of its budget hold no more tokens than
#: the budget (fewer than one token in 8 characters is rare in real text; a sparse text is tokenised in full)
PROBE_CHARS = 8


def _too_many_tokens(limit: int) -> ApiError:
    message = f"'inputs' are more than {limit} tokens; /tokenize answers at most {limit} (--max-tokens-in-flight)"
    return ApiError(413, message, "too_many_tokens", param="inputs")


#: A length bound no text reaches: what the over-length check tokenises with.
UNBOUNDED = 1 << 30

#: How a refusal names a request's texts: a request field (text i is ``field[i]``, the param ``field``), or each
#: text's own ``(name, param)``.
Field = str | Sequence[tuple[str, str]]


def text_name(field: Field, i: int) -> tuple[str, str]:
    """The name and param of text ``i`` of ``field``."""
    if isinstance(field, str):
        return f"{field}[{i}]", field
    return field[i]


def _byte_offsets(text: str) -> Callable[[int], int]:
    """The UTF-8 byte offset of each character offset of ``text``."""
    if text.isascii():
        return int
    ends = [0, *accumulate(len(c.encode("utf-8", "surrogatepass")) for c in text)]
    return ends.__getitem__


class RequestTokenizer:
    """Builds the features of request texts (and refuses over-long texts when truncation is off) on its own
    thread."""

    def __init__(self, engine: EncodingEngine, config: EmbeddingConfig, *, truncate: bool = True) -> None:
        tokenizer = copy.deepcopy(engine.backbone.tokenizer)
        self.builder = engine.input_builder(config, tokenizer)
        self.max_length = self.builder.max_length
        self.truncate = truncate
        self.unbounded = engine.input_builder(config, tokenizer, UNBOUNDED)  # --no-truncate, or a request's own
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmembed-tokenize")
        self.inspected = copy.deepcopy(tokenizer)  # /tokenize and /decode: their own copy, on their own thread
        self.inspector = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmembed-inspect")
        self.closed = False

    def build(
        self,
        texts: Sequence[str],
        instruction: str | None,
        field: Field = "input",
        truncate: bool | None = None,
        instruction_field: str | None = None,
    ) -> list[Features]:
        """Each text's features, as the model is fed them (after truncation); a text longer than the model reads is
        refused when this server does not truncate, or the request says ``truncate: false`` (TEI's field).

        ``field`` names the texts in a refusal: a request field (its texts are ``field[i]``) or each text's own
        ``(name, param)``. ``instruction_field``: the request field the instruction came from, named when the
        instruction leaves the text no room (``None``: the model's own prompt, and the texts are named)."""
        try:
            features = self.builder.build_all(texts, instruction)
            if not self.truncate or truncate is False:
                why = (
                    "this server does not truncate (--no-truncate)"
                    if not self.truncate
                    else "the request says truncate: false"
                )
                full = self.unbounded.build_all(texts, instruction)
                for i, (cut, whole) in enumerate(zip(features, full, strict=True)):
                    if len(whole) > len(cut):
                        name, param = text_name(field, i)
                        raise bad_request(
                            f"'{name}' is {len(whole)} tokens long; the model reads at most {self.max_length} "
                            f"and {why}",
                            "input_too_long",
                            param,
                        )
        except InputError as exc:
            if instruction_field is not None and instruction is not None and self._no_room(instruction):
                raise bad_request(
                    f"'{instruction_field}' is too long: {exc}; send a shorter instruction",
                    "instruction_too_long",
                    instruction_field,
                ) from None
            raise bad_request(str(exc), "invalid_input", text_name(field, 0)[1]) from None
        return features

    def _no_room(self, instruction: str) -> bool:
        """True when ``instruction`` alone leaves no token for a text."""
        try:
            self.builder.build_all(["a"], instruction)
        except InputError:
            return True
        return False

    def split(self, texts: Sequence[str], add_special_tokens: bool, limit: int) -> list[list[dict[str, Any]]]:
        """Each text's tokens as the model's tokenizer splits it (TEI's ``/tokenize``): no instruction and no cut,
        but with the special tokens the model reads, the end-of-sequence token lmembed appends included; a token is
        special when the tokenizer's template (or lmembed) added it, not when it is [UNK] or a special token's text
        typed in the input. More than ``limit`` tokens in all is a 413, said as soon as it is known: a text is
        tokenised whole only once a prefix of ``PROBE_CHARS`` characters a token of what is left fits."""
        tokenizer = self.inspected
        fast = getattr(tokenizer, "is_fast", False)
        out: list[list[dict[str, Any]]] = []
        count = 0
        for text in texts:
            left = limit - count
            if len(text) > left * PROBE_CHARS:
                head = tokenizer([text[: left * PROBE_CHARS]], add_special_tokens=False)["input_ids"][0]
                if len(head) > left:
                    raise _too_many_tokens(limit)
            encoded = tokenizer(
                [text],
                add_special_tokens=add_special_tokens,
                return_offsets_mapping=fast,
                return_special_tokens_mask=True,
                truncation=False,
            )
            ids, added = list(encoded["input_ids"][0]), list(encoded["special_tokens_mask"][0])
            spans: list[Any] = list(encoded["offset_mapping"][0]) if fast else [None] * len(ids)
            eos = self.builder.eos_id
            if add_special_tokens and eos is not None and (not ids or ids[-1] != eos):
                ids.append(eos)
                added.append(1)
                spans.append(None)
            count += len(ids)
            if count > limit:
                raise _too_many_tokens(limit)
            tokens = []
            at_byte = _byte_offsets(text)
            for token_id, piece, special, span in zip(
                ids, tokenizer.convert_ids_to_tokens(ids), added, spans, strict=True
            ):
                start, stop = (None, None) if special or span is None else span
                covered = piece if start is None else text[start:stop]
                if start is not None:  # TEI's spans count UTF-8 bytes (its tokenizer's), not characters
                    start, stop = at_byte(start), at_byte(stop)
                tokens.append({"id": token_id, "text": covered, "special": bool(special), "start": start, "stop": stop})
            out.append(tokens)
        return out

    def decode(self, ids: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
        return self.inspected.batch_decode(list(ids), skip_special_tokens=skip_special_tokens)

    async def inspect(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread of ``/tokenize`` and ``/decode`` (with a tokenizer of its own): a long one of
        those never holds up the texts being embedded."""
        if self.closed:
            raise ApiError(503, "the server is shutting down", "shutting_down")
        return await asyncio.get_running_loop().run_in_executor(self.inspector, fn, *args)

    async def features(
        self,
        texts: Sequence[str],
        instruction: str | None,
        field: Field = "input",
        truncate: bool | None = None,
        instruction_field: str | None = None,
    ) -> list[Features]:
        """:meth:`build` on the tokenizing thread."""
        if self.closed:
            raise ApiError(503, "the server is shutting down", "shutting_down")
        loop = asyncio.get_running_loop()
        build = self.build
        return await loop.run_in_executor(self.executor, build, texts, instruction, field, truncate, instruction_field)

    def close(self) -> None:
        self.closed = True
        self.executor.shutdown(wait=True)
        self.inspector.shutdown(wait=True)
