"""From a text to token ids plus a pooling mask.

A text may be wrapped before tokenisation: a task instruction in front of a query
(``Instruct: {task}\\nQuery: {text}``) or, for echo embeddings, a first copy of the text in a fixed
template. The wrapper tokens are fed to the model (they still attend and are attended to) but are
left out of pooling. Which tokens belong to the text proper is decided from the tokenizer's
character offsets on the whole string, so the token ids are exactly those of a plain tokenisation.

Truncation shortens the text itself, never the instruction or template; with echo both copies are
shortened alike.

A published model may fix more of this (:mod:`lmembed.models.presets`): a prefix for texts embedded without an
instruction (``plain_prefix``, GritLM's ``<|embed|>\n``), special tokens kept out of pooling even where no prefix
is (``pool_special_tokens=False``, LLM2Vec's embed mask) and which token ends a text read by last-token pooling
(``eos_token``, Qwen3-Embedding's ``<|endoftext|>``), and fixed text after a text embedded with an instruction
(``instruction_suffix``, bge-en-icl's ``\n<response>``): it is pooled with the text, so last-token pooling reads
its end, and truncation leaves room for it. With ``instruction_mask="token_count"`` (NV-Embed) the
tokens kept out of pooling are not found by offsets but counted as its code counts them: the first
``len(tokenizer.tokenize(prefix))`` tokens of the sequence, BOS included (so with a tokenizer that does not split
the prefix exactly where the whole string does, the prefix's last token is pooled, as in the reference). With
``instruction_mask="text_tokens"`` (LLM2Vec) the pooled tokens are the last N of the sequence, N being the length
of the text tokenised alone without special tokens, as llm2vec's embed mask counts them (a byte-level BPE splits
``" what"`` in context and ``"what"`` alone differently, so offsets and this count can disagree).

The final token last-token pooling reads is checked on the ids the tokenizer really produced: a preset that needs
one (``add_eos``) gets it appended only where the tokenizer did not put it there itself (under transformers 5 a
fast Llama tokenizer ignores ``add_eos_token`` in ``tokenizer_config.json``), and no room is reserved for it when
the tokenizer's own special tokens already end with it.

A published sentence-transformers model (``prompt_style="sentence_transformers"``) reads its prompts as
sentence-transformers does instead: the prompt is prepended as it is, the whole string is truncated to
``max_length`` by the tokenizer, and the prompt's tokens are the first N of the sequence, N being the length of
the prompt tokenised alone (less a closing special token); they are pooled when ``include_prompt`` is set.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmembed.config import EmbeddingConfig
from lmembed.errors import InputError

#: A text longer than PREFIX_CHARS characters per token of its budget (plus PREFIX_MARGIN_CHARS) is first tokenised
#: by a prefix of that length: where the prefix's own tokens show the cut, the rest of the text is never tokenised.
PREFIX_CHARS = 8
#: How far the cut must stay from the prefix's end, in whole pre-tokens (words) and in characters, for the prefix's
#: tokens before it to be the whole text's: what the tokenizer does at the prefix's end cannot reach back that far.
PREFIX_MARGIN_WORDS = 2
PREFIX_MARGIN_CHARS = 64
#: Tokens past its own budget a text keeps before it is wrapped and the wrapped string is cut as a whole
#: (:meth:`InputBuilder._build_cut`): more than joining the wrapper can take from the text's first word.
WHOLE_CUT_SLACK = 16
#: The normalizers and pre-tokenizers whose work on a string is local (a character, a word, a run of spaces), so
#: that a prefix of a text is normalised and split as the text's beginning is. A tokenizer with any other step (or
#: with no pre-tokenizer: the whole text is one piece) is always tokenised whole.
LOCAL_NORMALIZERS = frozenset(
    {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Strip", "Prepend", "Precompiled"}
    | {"Replace", "Sequence"}
)
LOCAL_PRE_TOKENIZERS = frozenset(
    {"BertPreTokenizer", "ByteLevel", "Metaspace", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits", "Split"}
    | {"UnicodeScripts", "Sequence"}
)


@dataclass
class Features:
    input_ids: list[int]
    pool_mask: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


def validate_texts(texts: Any, argument: str = "texts") -> list[str]:
    """Accept a list/tuple of strings; reject the rest with a message naming the bad item.

    Empty or whitespace-only strings are allowed and documented: they embed the model's special
    tokens (for a decoder with none, its end-of-text token). ``None`` and non-strings are rejected.
    """
    if isinstance(texts, str):
        raise InputError(f"{argument} must be a list of strings, not a single string (wrap it: [{texts[:30]!r}])")
    if texts is None:
        raise InputError(f"{argument} is None; expected a list of strings")
    if isinstance(texts, Mapping | bytes | bytearray | set | frozenset):  # a dict's keys, a set's order: not texts
        raise InputError(f"{argument} must be a list of strings, got {type(texts).__name__}")
    if hasattr(texts, "columns") or getattr(texts, "ndim", 1) != 1:  # a table iterates over its column names
        raise InputError(
            f"{argument} must be a list of strings, got a {getattr(texts, 'ndim', 2)}-dimensional "
            f"{type(texts).__name__}; pass one column (e.g. frame['text'].tolist())"
        )
    try:
        items = list(texts)
    except TypeError as exc:
        raise InputError(f"{argument} must be a list of strings, got {type(texts).__name__}") from exc
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise InputError(f"{argument}[{i}] is {type(item).__name__} ({item!r:.40}); every item must be a str")
        check_encodable(item, f"input {i}: text")
    return items


def check_encodable(text: str, what: str) -> None:
    """Raise :class:`InputError` if ``text`` is not a string or cannot be encoded as UTF-8 (a lone surrogate,
    typically from bytes decoded with ``errors="surrogateescape"``); ``what`` names the text in the message."""
    if not isinstance(text, str):
        raise InputError(f"{what} must be a string, got {type(text).__name__} ({text!r:.40})")
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.end]
        raise InputError(
            f"{what} contains a lone surrogate ({bad!r} at character {exc.start}) that cannot be encoded as "
            "UTF-8; decode the source bytes with errors='replace' or drop the character"
        ) from None


def wants_eos(config: EmbeddingConfig, is_decoder: bool) -> bool:
    if config.add_eos is not None:
        return config.add_eos
    return is_decoder and config.pooling == "last"


def eos_id(tokenizer: Any, config: EmbeddingConfig) -> int | None:
    """The id of the token appended for last-token pooling: ``config.eos_token`` if set, else the tokenizer's EOS."""
    if config.eos_token is None:
        return tokenizer.eos_token_id
    token_id = tokenizer.convert_tokens_to_ids(config.eos_token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise InputError(f"eos_token={config.eos_token!r} is not a token of this tokenizer's vocabulary")
    return token_id


_TOKENIZER_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


def tokenizer_lock(tokenizer: Any) -> threading.Lock:
    """The lock of ``tokenizer``: its backend's truncation is set before each batch is encoded, and the input
    builders of Embedders made with ``with_config`` share one tokenizer, so two threads could encode with each
    other's limit (a text came back cut at the other strategy's length). The server gives each thread a copy."""
    with _LOCKS_LOCK:
        lock = _TOKENIZER_LOCKS.get(tokenizer)
        if lock is None:
            lock = _TOKENIZER_LOCKS[tokenizer] = threading.Lock()
        return lock


class InputBuilder:
    """Tokenises texts for one forward configuration."""

    def __init__(self, tokenizer: Any, config: EmbeddingConfig, *, is_decoder: bool, max_length: int) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise InputError("lmembed needs a fast (Rust) tokenizer for offset mapping; load it with use_fast=True")
        self.tokenizer = tokenizer
        self.config = config
        self.max_length = max_length
        self.eos_id = eos_id(tokenizer, config) if wants_eos(config, is_decoder) else None
        if wants_eos(config, is_decoder) and self.eos_id is None:
            raise InputError("pooling='last' with add_eos needs a tokenizer with an EOS token")
        with tokenizer_lock(tokenizer):  # a tokenizer call resets the backend's truncation another thread may be using
            empty = tokenizer("", add_special_tokens=True)["input_ids"]
        self.num_special = len(empty)
        # the tokenizer's own post-processor already ends a text with the final token: no room to reserve for it
        self.tokenizer_ends_with_eos = self.eos_id is not None and bool(empty) and empty[-1] == self.eos_id
        candidates = (tokenizer.eos_token_id, tokenizer.sep_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id)
        self.placeholder_id = next((t for t in candidates if t is not None), 0)
        self.sentence_transformers = config.prompt_style == "sentence_transformers"
        self._prompt_lengths: dict[str, int] = {}
        self._prefix_counts: dict[str, int] = {}
        self._prefix_safe: bool | None = None  # whether a prefix may stand for a long text (_exact_prefixes)

    # -------------------------------------------------------------- wrapping
    def _prefix(self, text: str, instruction: str | None) -> tuple[str, int]:
        """Return (prefix, copies): the non-pooled text before the final copy of ``text``."""
        prefix = ""
        if instruction:
            prefix += self.config.instruction_template.format(instruction=instruction)
        else:
            prefix += self.config.plain_prefix
        if self.config.echo:
            prefix += self.config.echo_template.format(text=text)
        return prefix, 2 if self.config.echo else 1

    def _suffix(self, instruction: str | None) -> str:
        """The fixed text after the text: ``instruction_suffix`` when an instruction is given."""
        return self.config.instruction_suffix if instruction else ""

    def _encode(self, texts: Sequence[str], *, special: bool, max_length: int | None = None) -> list[Any]:
        """The Rust encodings (``.ids``, ``.offsets``, ``.special_tokens_mask``) that
        ``tokenizer(texts, add_special_tokens=special, truncation=max_length is not None, max_length=max_length)``
        is made of, with the backend set up as that call sets it. The wrapper's conversion of every encoding to
        Python lists is skipped: on a GPU it took more of an encode call than the model (bench/gpu_throughput.py)."""
        with tokenizer_lock(self.tokenizer):  # the settings below are the shared tokenizer's until encoded
            return self._encode_locked(texts, special=special, max_length=max_length)

    def _encode_locked(self, texts: Sequence[str], *, special: bool, max_length: int | None) -> list[Any]:
        rust = self.tokenizer.backend_tokenizer
        if rust.padding is not None:
            rust.no_padding()
        if max_length is None:
            if rust.truncation is not None:
                rust.no_truncation()
        else:
            target = {
                "max_length": max_length,
                "stride": 0,
                "strategy": "longest_first",
                "direction": self.tokenizer.truncation_side,
            }
            current = rust.truncation
            if current is None or {k: current.get(k) for k in target} != target:
                rust.enable_truncation(**target)
        split = bool(getattr(self.tokenizer, "split_special_tokens", False))
        if rust.encode_special_tokens != split:
            rust.encode_special_tokens = split
        return rust.encode_batch(list(texts), add_special_tokens=special)

    def _count(self, text: str) -> int:
        return len(self._encode([text], special=False)[0])

    # -------------------------------------------------------------- building
    def _budget(self, instruction: str | None) -> tuple[int, int]:
        """(tokens left for the text itself, the tokenizer's length limit for the whole wrapped string)."""
        appended = self.eos_id is not None and not self.tokenizer_ends_with_eos
        room = self.max_length - self.num_special - (1 if appended else 0)
        wrapper, copies = self._prefix("", instruction)
        budget = (room - self._count(wrapper) - self._count(self._suffix(instruction))) // copies
        if budget < 1:
            raise InputError(f"max_length={self.max_length} leaves no room for the text after the instruction/template")
        return budget, room + self.num_special

    def build(self, text: str, instruction: str | None = None) -> Features:
        """One text's features: ``build_all([text], instruction)[0]``."""
        return self.build_all([text], instruction)[0]

    def _features(self, enc: Any, prefix: str, text_tokens: int | None = None) -> Features:
        """Features of one wrapped text from its encoding (see :meth:`_encode`); ``text_tokens``: the length of the
        text tokenised alone, for ``instruction_mask="text_tokens"``."""
        ids = enc.ids
        start = 0 if self.config.include_prompt else len(prefix)
        if text_tokens is not None:  # LLM2Vec: the last len(text tokens) positions, whatever they hold
            keep = min(text_tokens, len(ids))
            pool_mask = [0] * (len(ids) - keep) + [1] * keep
        elif start and self.config.instruction_mask == "token_count":
            skip = min(self._prefix_count(prefix), len(ids))
            pool_mask = [0] * skip + [1] * (len(ids) - skip)
        else:
            pool_mask = self._pool_mask(enc, start, self.config.pool_special_tokens)
        if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids.append(self.eos_id)
            pool_mask.append(1)
        if not any(pool_mask):  # an empty text with nothing to pool: embed the end-of-text token
            ids.append(self.placeholder_id)
            pool_mask.append(1)
        return Features(ids, pool_mask)

    def _prefix_count(self, prefix: str) -> int:
        """``len(tokenizer.tokenize(prefix))``: the positions NV-Embed's pool mask zeroes."""
        if prefix not in self._prefix_counts:
            with tokenizer_lock(self.tokenizer):
                self._prefix_counts[prefix] = len(self.tokenizer.tokenize(prefix))
        return self._prefix_counts[prefix]

    @staticmethod
    def _pool_mask(enc: Any, start: int, pool_special: bool = True) -> list[int]:
        """1 on tokens of the text proper (their text ends past ``start``, the wrapper's length); special tokens
        count when no prefix is excluded or when they come after the text has started (e.g. a closing [SEP]/EOS),
        unless ``pool_special`` is False. With nothing excluded (``start`` 0) every token counts, as
        sentence-transformers pools them: a token with no text of its own (a byte-level BPE's prefix space "Ġ"
        before a text that starts with a space, CJK or an emoji) among them; it was left out, and such texts'
        vectors were not the published models' (cosine 0.95-0.99 on RoBERTa-family models)."""
        special = enc.special_tokens_mask
        if start == 0:
            return [1] * len(special) if pool_special else [1 - s for s in special]
        mask = []
        seen_text = False
        for (_, end), is_special in zip(enc.offsets, special, strict=True):
            if is_special:
                mask.append(1 if pool_special and seen_text else 0)
                continue
            inside = end > start
            seen_text = seen_text or inside
            mask.append(1 if inside else 0)
        return mask

    def build_all(self, texts: Sequence[str], instruction: str | None = None) -> list[Features]:
        """Each text's features, from batched tokenizer calls over the whole list (the fast tokenizer encodes a
        batch in Rust, each text exactly as it would alone): one where a text is read as it is and fits, two where
        it is wrapped or cut."""
        if not texts:
            return []
        if self.sentence_transformers:
            return self._build_prompted(texts, instruction)
        budget, limit = self._budget(instruction)
        if self._bare(instruction):
            return self._build_bare(texts, instruction, budget, limit)
        return self._build_cut(texts, instruction, budget, limit)

    def _bare(self, instruction: str | None) -> bool:
        """Whether a text is read as it is: nothing wrapped around it and the pooled tokens found by offsets."""
        return (
            not self.config.echo
            and self._prefix("", instruction)[0] == ""
            and self._suffix(instruction) == ""
            and self.config.instruction_mask != "text_tokens"
        )

    def _build_bare(self, texts: Sequence[str], instruction: str | None, budget: int, limit: int) -> list[Features]:
        """:meth:`_build_cut`'s features for texts read as they are, from one tokenizer pass where a text fits. The
        string tokenised is the text itself, so its encoding with special tokens is its plain one (ids and offsets)
        with the post-processor's ``num_special`` around it: a text within ``budget`` is not cut, and one over it
        is truncated at the limit by the tokenizer, read on a prefix of it where that is exact
        (:meth:`_exact_prefixes`), in the same single pass. Tokenising was up to two thirds of an encode call on a
        GPU (bench/gpu_throughput.py); this halves it for texts that fit, and reads little more than ``max_length``
        tokens of a long one."""
        # every text truncated by the tokenizer at the limit (as sentence-transformers and the cards cut it; a left-
        # truncating one keeps a long text's end), a long one read on a prefix that shows its kept tokens exactly
        exact = {} if self._cuts_left() else self._exact_prefixes(texts, budget)
        order = [*(i for i in range(len(texts)) if i not in exact), *exact]
        given = [texts[i][: prefix_span(budget)] if i in exact else texts[i] for i in order]
        by_index = dict(zip(order, self._encode(given, special=True, max_length=limit), strict=True))
        return [self._features(by_index[i], "") for i in range(len(texts))]

    def _exact_prefixes(self, texts: Sequence[str], budget: int) -> dict[int, int]:
        """For each long text whose prefix shows its first ``budget`` tokens exactly, by index: where its
        ``budget``-th token ends (where :meth:`_build_cut` cuts it). The prefix, ``texts[i][:prefix_span(budget)]``
        (``PREFIX_CHARS`` characters a token), is tokenised alone; its tokens before the last ``PREFIX_MARGIN_WORDS``
        words (and ``PREFIX_MARGIN_CHARS`` characters) are the whole text's when every step before the model is
        local (``LOCAL_NORMALIZERS``, ``LOCAL_PRE_TOKENIZERS``: the model then reads one word at a time). A text
        whose ``budget``-th token falls nearer the prefix's end than that, or that has fewer tokens, is left out
        (tokenised whole by the caller)."""
        span = prefix_span(budget)
        long = [i for i, text in enumerate(texts) if len(text) > span]
        if not long or not self._prefixes_are_exact():
            return {}
        ends: dict[int, int] = {}
        for i, enc in zip(long, self._encode([texts[i][:span] for i in long], special=False), strict=True):
            if len(enc) <= budget:
                continue
            word, last_word = enc.token_to_word(budget - 1), enc.token_to_word(len(enc) - 1)
            span_of_token = enc.token_to_chars(budget - 1)
            if word is None or last_word is None or span_of_token is None:
                continue
            end = span_of_token[1]
            if last_word - word >= PREFIX_MARGIN_WORDS and span - end >= PREFIX_MARGIN_CHARS:
                ends[i] = end
        return ends

    def _prefixes_are_exact(self) -> bool:
        """Whether this tokenizer's normalizer and pre-tokenizer are local kinds (see :meth:`_exact_prefixes`)."""
        if self._prefix_safe is None:
            try:
                state = json.loads(self.tokenizer.backend_tokenizer.to_str())
            except (AttributeError, ValueError, TypeError):
                state = {}
            self._prefix_safe = _local(state.get("normalizer"), LOCAL_NORMALIZERS, none_ok=True) and _local(
                state.get("pre_tokenizer"), LOCAL_PRE_TOKENIZERS, none_ok=False
            )
        return self._prefix_safe

    def _cuts_left(self) -> bool:
        """Whether a long text keeps its end (``truncation_side="left"``, from the folder's tokenizer settings)."""
        return getattr(self.tokenizer, "truncation_side", "right") == "left"

    def _build_cut(
        self, texts: Sequence[str], instruction: str | None, budget: int, limit: int, *, prefixes: bool = True
    ) -> list[Features]:
        """Each text wrapped, tokenised and masked for pooling. With nothing after the text the wrapped string is
        truncated at the limit by the tokenizer; else (a suffix, echo, LLM2Vec's text-token mask, a left cut) the text
        is first cut to ``budget`` tokens of its own (by the offset of its last kept token, or first for a left cut)
        so that the wrapper stays whole. A long text's cut is found on a prefix where that is exact
        (:meth:`_exact_prefixes`); ``prefixes=False`` tokenises every text whole first (the reference the tests
        and bench/tokenise_passes.py compare with)."""
        suffix = self._suffix(instruction)
        left = self._cuts_left()
        # with nothing after the text and a right cut, the wrapped string is cut as a whole at the limit, as the
        # published cards cut (E5-mistral, SFR, Qwen3-Embedding: the instruction and text together, then EOS); a
        # long text is first shortened to a prefix that shows a few tokens past its cut exactly, where there is one.
        # Cutting the text alone to the budget left 1-3 tokens unused where the wrapper's last space joins the
        # text's first word, and a word cut in two could be tokenised otherwise than the tokenizer truncates it
        whole = not suffix and not left and not self.config.echo and self.config.instruction_mask != "text_tokens"
        reach = budget + WHOLE_CUT_SLACK if whole else budget
        ends = self._exact_prefixes(texts, reach) if prefixes and not left else {}
        rest = [] if whole else [i for i in range(len(texts)) if i not in ends]  # whole: the tokenizer cuts
        plain = dict(zip(rest, self._encode([texts[i] for i in rest], special=False), strict=True))
        starts: dict[int, int] = {}
        for i, enc in plain.items():  # only the long texts' offsets are read
            if left and len(enc) > budget:  # the text's last budget tokens; the wrapper stays whole
                starts[i] = enc.token_to_chars(len(enc) - budget)[0]
            elif not whole and len(enc) > budget:
                ends[i] = enc.token_to_chars(budget - 1)[1]
        if whole:  # the prefix whose first `reach` tokens are the whole text's, as _exact_prefixes read it
            ends = dict.fromkeys(ends, prefix_span(reach))
        cut = [text[starts.get(i, 0) : ends.get(i, len(text))] for i, text in enumerate(texts)]
        prefixes = [self._prefix(text, instruction)[0] for text in cut]
        wrapped = self._encode(
            [p + t + suffix for p, t in zip(prefixes, cut, strict=True)], special=True, max_length=limit
        )
        counts: list[int | None] = [None] * len(cut)
        if self.config.instruction_mask == "text_tokens":  # each text tokenised alone, as llm2vec counts it
            counts = [len(enc) for enc in self._encode(cut, special=False)]
        return [
            self._features(enc, prefix, count) for enc, prefix, count in zip(wrapped, prefixes, counts, strict=True)
        ]

    # -------------------------------------------------------------- sentence-transformers prompts
    def _build_prompted(self, texts: Sequence[str], instruction: str | None) -> list[Features]:
        """Features as sentence-transformers makes them: ``prompt + text`` truncated as a whole, the prompt's
        tokens (counted as it counts them) left out of pooling unless ``include_prompt``."""
        prompt = self.config.instruction_template.format(instruction=instruction) if instruction else ""
        room = self.max_length - (1 if self.eos_id is not None else 0)
        strings = [prompt + text for text in texts]
        # truncation keeps a string's first ``kept`` tokens: where a prefix shows them exactly, the prefix is read
        kept = room - self.num_special
        right = self.tokenizer.truncation_side == "right"
        exact = self._exact_prefixes(strings, kept) if right and kept >= 1 else {}
        rest = [i for i in range(len(strings)) if i not in exact]
        order = [*exact, *rest]
        given = [strings[i][: prefix_span(kept)] for i in exact] + [strings[i] for i in rest]
        by_index = dict(zip(order, self._encode(given, special=True, max_length=room), strict=True))
        encodings = [by_index[i] for i in range(len(strings))]
        skip = 0 if not prompt or self.config.include_prompt else self._prompt_length(prompt, room)
        features = []
        for enc in encodings:
            ids = enc.ids
            pool_mask = [0] * min(skip, len(ids)) + [1] * max(len(ids) - skip, 0)
            if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
                ids.append(self.eos_id)
                pool_mask.append(1)
            features.append(Features(ids, pool_mask))
        return features

    def _prompt_length(self, prompt: str, room: int) -> int:
        """Tokens of ``prompt`` tokenised alone, less a closing special token (sentence-transformers' count)."""
        if prompt not in self._prompt_lengths:
            with tokenizer_lock(self.tokenizer):
                ids = self.tokenizer(prompt, add_special_tokens=True, truncation=True, max_length=room)["input_ids"]
            closing = bool(ids) and ids[-1] in set(self.tokenizer.all_special_ids)
            self._prompt_lengths[prompt] = len(ids) - (1 if closing else 0)
        return self._prompt_lengths[prompt]


def prefix_span(budget: int) -> int:
    """How many characters of a long text are tokenised to find its first ``budget`` tokens (``_exact_prefixes``)."""
    return PREFIX_CHARS * budget + PREFIX_MARGIN_CHARS


def _local(step: Any, kinds: frozenset[str], *, none_ok: bool) -> bool:
    """Whether a tokenizer step (its JSON) is of ``kinds``, a ``Sequence`` of such steps included."""
    if step is None:
        return none_ok
    if not isinstance(step, dict) or step.get("type") not in kinds:
        return False
    if step["type"] == "Sequence":
        parts = step.get("normalizers", step.get("pretokenizers"))
        return isinstance(parts, list) and bool(parts) and all(_local(p, kinds, none_ok=False) for p in parts)
    return True
