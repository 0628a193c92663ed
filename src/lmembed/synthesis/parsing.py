"""Strict reading of a generator's answers: repaired where the repair is safe, rejected with a reason.

JSON answers (:func:`parse_object`, :func:`parse_string_list`): the repairs are code fences around the JSON, prose
before or after it (the outermost ``{...}`` or ``[...]`` is taken), trailing commas; everything else is a
rejection named by one of :data:`REASONS`. Plain-text query answers (:func:`parse_query_line`, for recipes with
``answer: plain-query``, made for small generators that cannot hold a JSON format): one line of a sane length,
about its passage but not a copy of it; the only repairs are a leading ``Query:`` label and surrounding quotes;
everything else is a rejection named by one of :data:`QUERY_REASONS`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from lmembed.io import lone_surrogate

#: why an answer is rejected
REASONS = ("not_json", "wrong_type", "missing_field", "empty_field")
#: why a plain-text query answer is rejected
QUERY_REASONS = (
    "empty",
    "invalid_unicode",
    "not_plain",
    "multi_line",
    "too_short",
    "too_long",
    "not_question",
    "copy",
    "off_passage",
)


@dataclass(frozen=True)
class Parsed:
    """A parsed answer (``value``), or why it was rejected (``reason``, with ``detail``); ``repaired`` says that
    the JSON was only found after a repair."""

    value: Any = None
    reason: str | None = None
    detail: str = ""
    repaired: bool = False

    @property
    def ok(self) -> bool:
        return self.reason is None


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
_CLOSER_AHEAD = re.compile(r"\s*[}\]]")


def _drop_trailing_commas(text: str) -> str:
    """``text`` without the commas that stand before a closing ``}`` or ``]`` (whitespace between allowed),
    outside JSON strings only: a comma inside a string value is the generator's text and stays."""
    out: list[str] = []
    in_string = escaped = False
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "," and _CLOSER_AHEAD.match(text, i + 1):
            continue
        out.append(char)
    return "".join(out)


def _broken_unicode(value: Any) -> Parsed | None:
    """An ``invalid_unicode`` rejection when ``value`` (the answer, or what it decoded to) holds a lone surrogate
    (half an emoji, as an LLM's JSON escape ``\\ud83d`` decodes): it cannot be written as UTF-8, and a shard
    holding it failed to be written (every rerun again)."""
    problem = lone_surrogate(value)
    return Parsed(reason="invalid_unicode", detail=problem) if problem else None


def _load(text: str, opener: str, closer: str) -> tuple[Any, bool] | None:
    text = text.strip()
    try:
        return json.loads(text), False
    except json.JSONDecodeError:
        pass
    fenced = _FENCE.search(text)
    candidate = fenced.group(1) if fenced else text
    start, end = candidate.find(opener), candidate.rfind(closer)
    if start < 0 or end <= start:
        return None
    candidate = _drop_trailing_commas(candidate[start : end + 1])
    try:
        return json.loads(candidate), True
    except json.JSONDecodeError:
        return None


def parse_object(text: str, keys: tuple[str, ...], *, plain_text: bool = False) -> Parsed:
    """A JSON object whose ``keys`` all hold non-empty strings (other keys are dropped). With ``plain_text`` and a
    single key, an answer with no JSON in it is taken as that field's value (its first non-empty line, quotes
    stripped), counted as a repair: small models often answer the text and skip the JSON."""
    if broken := _broken_unicode(text):
        return broken
    loaded = _load(text, "{", "}")
    bare = loaded is None or isinstance(loaded[0], str)
    if bare and plain_text and len(keys) == 1 and "{" not in text:
        line = next((ln.strip().strip('"').strip() for ln in text.splitlines() if ln.strip().strip('"').strip()), "")
        if line:
            return Parsed(value={keys[0]: line}, repaired=True)
    if loaded is None:
        return Parsed(reason="not_json", detail=text[:80])
    value, repaired = loaded
    if broken := _broken_unicode(value):  # an escape "\ud83d" alone, decoded
        return broken
    if not isinstance(value, dict):
        return Parsed(reason="wrong_type", detail=type(value).__name__)
    missing = [k for k in keys if k not in value]
    if missing:
        return Parsed(reason="missing_field", detail=",".join(missing))
    out = {}
    for key in keys:
        field = value[key]
        if isinstance(field, (int, float)) and not isinstance(field, bool):
            field = str(field)
        if not isinstance(field, str):
            return Parsed(reason="wrong_type", detail=f"{key}: {type(field).__name__}")
        if not field.strip():
            return Parsed(reason="empty_field", detail=key)
        out[key] = field.strip()
    return Parsed(value=out, repaired=repaired)


def parse_string_list(text: str) -> Parsed:
    """A JSON list of non-empty strings (empty entries dropped; none left is a rejection)."""
    if broken := _broken_unicode(text):
        return broken
    loaded = _load(text, "[", "]")
    if loaded is None:
        return Parsed(reason="not_json", detail=text[:80])
    value, repaired = loaded
    if broken := _broken_unicode(value):
        return broken
    if not isinstance(value, list):
        return Parsed(reason="wrong_type", detail=type(value).__name__)
    items = [str(v).strip() for v in value if isinstance(v, (str, int, float)) and str(v).strip()]
    if not items:
        return Parsed(reason="empty_field", detail="list")
    return Parsed(value=items, repaired=repaired)


_LABEL = re.compile(r"^(?:\*\*)?(?:search\s+)?(?:query|question)\s*(?:\d+\s*)?:\s*(?:\*\*)?\s*", re.IGNORECASE)
_QUOTES = "\"'`\u201c\u201d\u2018\u2019"
_WORD = re.compile(r"\w+")
#: words a query may share with any passage without being about it (and that echo the prompt)
_GENERIC = frozenset(
    [
        "what",
        "which",
        "when",
        "where",
        "whom",
        "whose",
        "does",
        "this",
        "that",
        "these",
        "those",
        "with",
        "from",
        "about",
        "into",
        "there",
        "their",
        "have",
        "been",
        "were",
        "will",
        "would",
        "could",
        "should",
        "question",
        "questions",
        "answer",
        "answers",
        "passage",
        "text",
        "following",
        "next",
        "search",
        "query",
    ]
)


def _copied_fraction(query_words: list[str], passage: str, n: int = 3) -> float:
    """The share of the query's word ``n``-grams found in the passage (1.0: every one is copied)."""
    grams = {tuple(query_words[i : i + n]) for i in range(len(query_words) - n + 1)}
    if not grams:
        return 0.0
    words = _WORD.findall(passage.lower())
    seen = {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}
    return len(grams & seen) / len(grams)


def parse_query_line(
    text: str,
    passage: str = "",
    *,
    min_words: int = 3,
    max_words: int = 32,
    max_copied: float = 0.8,
    question: bool = False,
) -> Parsed:
    """One search query written as plain text: a single non-empty line (a leading ``Query:`` label and
    surrounding quotes are stripped, counted as a repair) of ``min_words`` to ``max_words`` words, of which at
    most ``max_copied`` of the word trigrams appear in ``passage`` (more is a copied sentence, not a query) and
    that shares at least one content word (four letters or more, not a question word) with ``passage`` (else it
    is about nothing in it, e.g. the prompt echoed: "What is the question?"); with ``question``, it must end with
    a question mark (a small model asked for a question often answers instead: "The answer to your question is:
    ..."). Anything else is rejected with a reason from :data:`QUERY_REASONS`."""
    if broken := _broken_unicode(text):
        return broken
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return Parsed(reason="empty")
    if "{" in text or "}" in text:
        return Parsed(reason="not_plain", detail=text[:80])
    if len(lines) > 1:
        return Parsed(reason="multi_line", detail=f"{len(lines)} lines")
    line = lines[0]
    query = _LABEL.sub("", line).strip().strip(_QUOTES).strip()
    repaired = query != line
    words = _WORD.findall(query.lower())
    if not words:
        return Parsed(reason="empty")
    if len(words) < min_words:
        return Parsed(reason="too_short", detail=f"{len(words)} words")
    if len(words) > max_words:
        return Parsed(reason="too_long", detail=f"{len(words)} words")
    if question and not query.endswith("?"):
        return Parsed(reason="not_question", detail=query[:80])
    if passage and (query.lower() in passage.lower() or _copied_fraction(words, passage) > max_copied):
        return Parsed(reason="copy", detail=query[:80])
    if passage and not {w for w in words if len(w) >= 4 and w not in _GENERIC} & set(_WORD.findall(passage.lower())):
        return Parsed(reason="off_passage", detail=query[:80])
    return Parsed(value={"query": query}, repaired=repaired)
