"""HTTP errors of the server, each answered in the error shape of the API the route speaks.

An OpenAI route (and any other) answers ``{"error": {"message": ..., "type": ..., "code": ...}}``: ``message``
says what was wrong in words (naming the field or the input position), ``type`` is the OpenAI error family of
the status, ``code`` a stable machine-readable name (``too_many_inputs``, ``input_too_long`` ...). A Text
Embeddings Inference route answers TEI's ``{"error": message, "error_type": ...}`` and a Cohere route Cohere's
``{"message": ...}``, so that those clients show the message as they show their own servers'; both carry the
same ``code`` (and ``param``, where one field was wrong) beside it.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from typing import Any

from lmembed.errors import LmembedError

#: The OpenAI error family of each status the server answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    500: "server_error",
    503: "service_unavailable_error",
}

#: The routes of Text Embeddings Inference's API and of Cohere's (v2), whose clients read their own error shape.
TEI_ROUTES = frozenset({"/embed", "/embed_all", "/", "/rerank", "/similarity", "/tokenize", "/decode", "/info"})
COHERE_ROUTES = frozenset({"/v2/embed", "/v2/rerank"})
#: TEI's ``error_type`` of each status that is not a plain refusal of the request (``Validation``).
TEI_ERROR_TYPES = {429: "Overloaded", 500: "Backend", 503: "Unhealthy"}


class ApiError(LmembedError, ValueError):
    """A request the server refuses (or could not serve), with its HTTP status and error code."""

    def __init__(self, status: int, message: str, code: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self, path: str = "") -> dict[str, Any]:
        """The JSON body of this refusal on the route ``path`` (its dialect's error shape)."""
        if path in TEI_ROUTES:
            kind = TEI_ERROR_TYPES.get(self.status, "Validation" if self.status < 500 else "Backend")
            return {"error": self.message, "error_type": kind, **self._code()}
        if path in COHERE_ROUTES:
            return {"message": self.message, **self._code()}
        return {"error": {"message": self.message, "type": self.type, **self._code()}}

    def _code(self) -> dict[str, str]:
        return {"code": self.code} if self.param is None else {"code": self.code, "param": self.param}


def bad_request(message: str, code: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code, param=param)


def only_fields(payload: dict[str, Any], known: Sequence[str], what: str) -> None:
    """400 ``unknown_field`` for a field the route does not take: a misspelt ``dimension`` would otherwise change
    nothing without a word (the answer's vectors keep every dimension)."""
    if unknown := sorted(set(payload) - set(known)):
        name = unknown[0] if len(unknown[0]) <= 60 else unknown[0][:57] + "..."
        raise bad_request(f"'{name}' is not a field of {what} (it takes {', '.join(known)})", "unknown_field", name)


def too_many_inputs(field: str, count: int, limit: int, unit: str = "items") -> ApiError:
    """413: ``field`` holds ``count`` ``unit``, over the ``--max-inputs`` limit of one request."""
    message = f"'{field}' has {count} {unit}; the limit is {limit} per request (--max-inputs)"
    return ApiError(413, message, "too_many_inputs", param=field)


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxlevel = 6, 4, 2


def shown(value: Any) -> str:
    """``repr(value)`` cut to a few dozen characters: a refusal names the value, never echoes megabytes of it."""
    return _SHOWN.repr(value)
