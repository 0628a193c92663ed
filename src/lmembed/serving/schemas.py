"""Request parsing and validation, and response bodies, for the OpenAI-compatible endpoints.

``POST /v1/embeddings`` takes OpenAI's fields, ``input`` (a string or a list of strings; token-id arrays
are refused), ``model``, ``encoding_format`` (``float`` or ``base64``: little-endian float32),
``dimensions`` (Matryoshka: keep the first N, then normalise as the strategy does) and ``user``, plus two
extensions: ``input_type`` (``query`` gets the instruction, the request's ``instruction`` or the
strategy's ``query_instruction``; ``document`` gets none, as ``encode_corpus`` does) and ``instruction``.

``POST /v1/search`` takes ``query`` (a string or a list), ``k`` (or ``top_k``), optionally ``model`` and
``instruction``, and the search stages' fields; queries are embedded as ``Index.search`` embeds them.

Every route refuses a field it does not take (400 ``unknown_field`` naming it): a misspelt field would otherwise
change nothing without a word.

Every problem is an :class:`ApiError` (400 unless said otherwise) whose message names the field and,
for an input, its position.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmembed.config import SIDES
from lmembed.encoding.inputs import check_encodable
from lmembed.errors import InputError
from lmembed.io import DuplicateKeyError, is_whole_number, loads_json
from lmembed.serving.errors import bad_request, only_fields, shown, too_many_inputs

ENCODING_FORMATS = ("float", "base64")
#: what ``/v1/embeddings`` takes: OpenAI's fields and lmembed's two
EMBEDDING_FIELDS = ("input", "model", "encoding_format", "dimensions", "user", "input_type", "instruction")
INPUT_TYPES = SIDES
#: what ``/v1/search`` takes: its own fields and the search stages' (``rerank.parse_search_stages``)
SEARCH_FIELDS = ("query", "input", "k", "top_k", "model", "instruction", "mode", "fusion", "rerank", "rerank_top_k")


@dataclass(frozen=True)
class EmbeddingRequest:
    texts: list[str]
    model: str
    encoding_format: str = "float"
    dimensions: int | None = None
    input_type: str | None = None
    instruction: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class SearchRequest:
    queries: list[str]
    model: str
    k: int = 10
    instruction: str | None = None


#: Deepest nesting of arrays and objects a request body may have (no endpoint's schema needs more than 4).
MAX_JSON_DEPTH = 32


def json_depth_over(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``body`` nests arrays and objects deeper than ``limit`` (brackets inside strings do not count).

    Cheap and bounded, run before the parser (whose recursion a body of 100,000 ``[`` would exhaust): a body with
    at most ``limit`` opening brackets is passed at once; otherwise escapes are dropped, everything but brackets
    and quotes is deleted (in C), and the rest is scanned until the depth passes ``limit``."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    marks = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_MARKS)
    depth, in_string = 0, False
    for mark in marks:
        if mark == 0x22:  # '"'
            in_string = not in_string
        elif in_string:
            continue
        elif mark in (0x5B, 0x7B):  # '[' '{'
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


_NOT_MARKS = bytes(c for c in range(256) if c not in b'[]{}"')


def parse_json(body: bytes) -> Any:
    """The request body as a JSON object."""
    payload = parse_json_value(body)
    if not isinstance(payload, dict):
        raise bad_request("request body must be a JSON object", "invalid_json")
    return payload


def parse_json_value(body: bytes) -> Any:
    """The request body as any JSON value, its nesting bounded by :data:`MAX_JSON_DEPTH` before it is parsed."""
    if json_depth_over(body):
        raise bad_request(
            f"request body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels (the server's JSON depth limit)",
            "json_too_deep",
        )
    try:
        payload = loads_json(body)
    except DuplicateKeyError as exc:
        raise bad_request(
            f"request body gives {exc.key!r} twice in one object; give each field once", "invalid_json"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON ({exc})", "invalid_json") from None
    except RecursionError:  # not reached below MAX_JSON_DEPTH; kept so the parser's limit is never a 500
        raise bad_request("request body nests too deeply to parse", "json_too_deep") from None
    return payload


def _is_token_ids(value: list[Any]) -> bool:
    """An array of ints, or an array of arrays of ints (OpenAI's pre-tokenised input)."""
    if all(map(is_whole_number, value)):
        return True
    return all(isinstance(x, list) and x and all(map(is_whole_number, x)) for x in value)


def _texts(value: Any, field: str, max_inputs: int) -> list[str]:
    """A string or a non-empty list of non-empty strings, at most ``max_inputs`` of them."""
    if value is None:
        raise bad_request(f"'{field}' is required", "missing_input", field)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise bad_request(
            f"'{field}' must be a string or a list of strings, got {type(value).__name__}", "invalid_input", field
        )
    if not value:
        raise bad_request(f"'{field}' is an empty list; send at least one text", "empty_input", field)
    if _is_token_ids(value):
        raise bad_request(
            f"'{field}' holds token ids; this server takes text only (send the strings, it tokenizes them)",
            "token_ids_unsupported",
            field,
        )
    if len(value) > max_inputs:
        raise too_many_inputs(field, len(value), max_inputs)
    for i, item in enumerate(value):
        text_field(item, f"{field}[{i}]", param=field)
    return value


def _model(payload: dict[str, Any], served: Collection[str], default: str) -> str:
    model = payload.get("model")
    if model is None:
        return default
    if not isinstance(model, str) or model not in served:
        alias = model if isinstance(model, str) and len(model) <= 100 else "THAT_NAME"
        raise bad_request(
            f"model {shown(model)} is not served here; this server serves {', '.join(sorted(served))} (a client's "
            f"default name can be added on purpose: lmembed serve ... --served-model-name NAME,{alias})",
            "model_not_found",
            "model",
        )
    return model


def _choice(payload: dict[str, Any], field: str, allowed: Collection[str], code: str, default: Any = None) -> Any:
    """``field`` of ``payload``: absent or null gives ``default``; anything but one of the strings ``allowed`` is a
    400 naming the field (a list or an object too, and ``false``, ``0`` or ``""``, which are not a choice)."""
    value = payload.get(field)
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise bad_request(f"'{field}' must be one of {', '.join(map(repr, allowed))}, got {shown(value)}", code, field)
    return value


def text_field(value: Any, field: str, *, param: str | None = None) -> str:
    """``value`` as one non-empty text (a string the tokenizer can read), else a 400 naming ``field`` (``param``: the
    request field it belongs to, by default ``field`` itself)."""
    param = param or field
    if not isinstance(value, str):
        raise bad_request(f"'{field}' must be a string, got {type(value).__name__}", "invalid_input", param)
    if not value:
        raise bad_request(f"'{field}' is an empty string", "empty_input", param)
    try:
        check_encodable(value, f"'{field}'")
    except InputError as exc:
        raise bad_request(str(exc), "invalid_input", param) from None
    return value


def _optional_string(payload: dict[str, Any], field: str) -> str | None:
    value = payload.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"'{field}' must be a string, got {type(value).__name__}", f"invalid_{field}", field)
    try:
        check_encodable(value, f"'{field}'")
    except InputError as exc:
        raise bad_request(str(exc), f"invalid_{field}", field) from None
    return value


def _positive_int(value: Any, field: str, upper: int, code: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
        raise bad_request(f"'{field}' must be an integer from 1 to {upper} ({what}), got {shown(value)}", code, field)
    return value


def _dimensions(payload: dict[str, Any], field: str, dim: int, fixed_width: str | None) -> int | None:
    """The request's ``field`` (Matryoshka: how many dimensions to keep), 1 to ``dim``; where the model's vectors
    cannot be shortened (``fixed_width`` says why), only ``dim`` itself, which asks for nothing."""
    value = payload.get(field)
    if value is None:
        return None
    value = _positive_int(value, field, dim, "invalid_dimensions", f"the model has {dim}")
    if fixed_width is None:
        return value
    if value != dim:
        raise bad_request(
            f"'{field}' must be {dim} or absent for this model, got {value}: its vectors cannot be shortened "
            f"({fixed_width})",
            "invalid_dimensions",
            field,
        )
    return None


def parse_embedding_request(
    payload: dict[str, Any],
    *,
    served: Collection[str],
    default_model: str,
    max_inputs: int,
    dim: int,
    fixed_width: str | None = None,
) -> EmbeddingRequest:
    """Validate a ``/v1/embeddings`` body (see the module doc); ``dim`` is the largest ``dimensions``, and the only
    one where ``fixed_width`` says why the model's vectors cannot be shortened."""
    only_fields(payload, EMBEDDING_FIELDS, "an embedding request")
    texts = _texts(payload.get("input"), "input", max_inputs)
    model = _model(payload, served, default_model)
    encoding_format = _choice(payload, "encoding_format", ENCODING_FORMATS, "invalid_encoding_format", "float")
    dimensions = _dimensions(payload, "dimensions", dim, fixed_width)
    input_type = _choice(payload, "input_type", INPUT_TYPES, "invalid_input_type")
    instruction = _optional_string(payload, "instruction")
    if instruction is not None and input_type == "document":
        raise bad_request(
            "documents are embedded without an instruction; drop 'instruction' or use input_type 'query'",
            "instruction_not_allowed",
            "instruction",
        )
    user = _optional_string(payload, "user")
    return EmbeddingRequest(texts, model, encoding_format, dimensions, input_type, instruction, user)


def parse_search_request(
    payload: dict[str, Any], *, served: Collection[str], default_model: str, max_inputs: int, max_k: int
) -> SearchRequest:
    """Validate a ``/v1/search`` body (see the module doc)."""
    only_fields(payload, SEARCH_FIELDS, "a search request")
    for one, other in (("query", "input"), ("k", "top_k")):
        if one in payload and other in payload:
            raise bad_request(f"give '{one}' or its alias '{other}', not both", f"ambiguous_{one}", other)
    queries = _texts(payload.get("query", payload.get("input")), "query", max_inputs)
    model = _model(payload, served, default_model)
    field = "top_k" if "top_k" in payload else "k"
    k = _positive_int(payload.get(field, 10), field, max_k, "invalid_k", "results per query")
    return SearchRequest(queries, model, k, _optional_string(payload, "instruction"))


def embedding_body(vectors: np.ndarray, encoding_format: str, model: str, tokens: int) -> bytes:
    """The ``/v1/embeddings`` response, serialised (floats are written exactly: they read back bit-equal)."""
    vectors = np.ascontiguousarray(vectors, dtype="<f4")
    if encoding_format == "base64":
        items = [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
    else:
        items = vectors.tolist()
    data = [{"object": "embedding", "index": i, "embedding": item} for i, item in enumerate(items)]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json.dumps({"object": "list", "data": data, "model": model, "usage": usage}).encode()
