"""HTTP errors of the server, each answered with an OpenAI-style JSON body.

Every refusal has the same shape, ``{"error": {"message": ..., "type": ..., "code": ...}}``: ``message`` says
what was wrong in words (naming the field or the input position), ``type`` is the OpenAI error family of
the status, ``code`` a stable machine-readable name (``too_many_inputs``, ``input_too_long`` ...).
"""

from __future__ import annotations

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

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message, "type": self.type, "code": self.code}
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}


def bad_request(message: str, code: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code, param=param)
