"""Strict reading of a generator's JSON answers: repaired where the repair is safe, rejected with a reason.

The repairs: code fences around the JSON, prose before or after it (the outermost ``{...}`` or ``[...]`` is
taken), trailing commas. Everything else is a rejection, named by one of :data:`REASONS`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

#: why an answer is rejected
REASONS = ("not_json", "wrong_type", "missing_field", "empty_field")


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
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


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
    candidate = _TRAILING_COMMA.sub(r"\1", candidate[start : end + 1])
    try:
        return json.loads(candidate), True
    except json.JSONDecodeError:
        return None


def parse_object(text: str, keys: tuple[str, ...], *, plain_text: bool = False) -> Parsed:
    """A JSON object whose ``keys`` all hold non-empty strings (other keys are dropped). With ``plain_text`` and a
    single key, an answer with no JSON in it is taken as that field's value (its first non-empty line, quotes
    stripped), counted as a repair: small models often answer the text and skip the JSON."""
    loaded = _load(text, "{", "}")
    bare = loaded is None or isinstance(loaded[0], str)
    if bare and plain_text and len(keys) == 1 and "{" not in text:
        line = next((ln.strip().strip('"').strip() for ln in text.splitlines() if ln.strip().strip('"').strip()), "")
        if line:
            return Parsed(value={keys[0]: line}, repaired=True)
    if loaded is None:
        return Parsed(reason="not_json", detail=text[:80])
    value, repaired = loaded
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
    loaded = _load(text, "[", "]")
    if loaded is None:
        return Parsed(reason="not_json", detail=text[:80])
    value, repaired = loaded
    if not isinstance(value, list):
        return Parsed(reason="wrong_type", detail=type(value).__name__)
    items = [str(v).strip() for v in value if isinstance(v, (str, int, float)) and str(v).strip()]
    if not items:
        return Parsed(reason="empty_field", detail="list")
    return Parsed(value=items, repaired=repaired)
