"""Cohere v2 and Text Embeddings Inference (TEI) routes: their request fields and response shapes, served by the
same engine, batcher, limits, metrics and API key as the OpenAI routes.

Cohere v2 (``cohere.ClientV2(base_url=...)``)
    ``POST /v2/embed``: ``texts``, ``model``, ``input_type`` (``search_query`` embeds as a query, with its
    instruction; ``search_document`` as a document; ``classification``/``clustering`` as plain text),
    ``embedding_types`` (default ``["float"]``), ``output_dimension`` (Matryoshka), ``truncate`` (``END`` cuts a
    long text at its end, ``NONE`` refuses it, as TEI's ``truncate``; ``START`` is refused), ``max_tokens``
    (accepted when it is at least what the model reads), ``priority`` (an integer; no effect).
    Answer: ``{"id", "embeddings": {type: [...]}, "texts", "meta": {"billed_units": {"input_tokens"}}}``.

    ``POST /v2/rerank``: ``query``, ``documents`` (strings), ``top_n``, ``model``, ``return_documents``,
    ``max_tokens_per_doc`` (accepted when it is at least what the reranker reads), ``priority`` (no effect).
    Answer: ``{"id", "results": [{"index", "relevance_score"}], "meta"}``, best first.

Embedding types (Cohere's names; lmembed's quantisation, documented here since Cohere does not publish its own):

* ``float``: the served vector; ``base64``: its little-endian float32 bytes, base64-encoded;
* ``int8``: each vector scaled by its own largest magnitude to 127 and rounded (``round(v / max|v| * 127)``):
  a per-vector scale, so cosine similarity is kept to within rounding, whatever the model's value range;
* ``uint8``: the ``int8`` values plus 128 (0 to 255);
* ``ubinary``: one bit per dimension, 1 where the value is above 0, packed 8 per byte, first dimension in the
  high bit (``numpy.packbits``); ``binary``: the same bytes minus 128, as signed int8 (Cohere's definition).
  Both need a dimension divisible by 8 (else 400).

TEI (``huggingface_hub.InferenceClient(model=URL)``, TEI's own clients)
    ``POST /embed`` (and ``POST /``): ``inputs`` (a string or a list), ``normalize`` (default true: L2-normalised
    whatever the strategy; false: as pooled, not normalised, as TEI gives them), ``dimensions``, ``prompt_name``
    (``query`` embeds as a query, ``document``/``passage`` as a document), ``truncate`` (false: a text longer than
    the model reads is refused, 413, as TEI does; a ``--no-truncate`` server refuses it whatever the field) and
    ``truncation_direction`` (``Right`` only). Another field is refused by name. Answer: a list of vectors.

    ``POST /embed_all``: ``inputs``, ``prompt_name``, ``truncate``, ``truncation_direction``, as ``/embed`` reads
    them. Answer: per text, a vector per token (``Embedder.encode_tokens``: the states the strategy pools from, every
    token the model reads, before pooling and normalisation). One request's answer holds at most
    ``MAX_TOKEN_VALUES`` numbers (tokens x the model's width; 413 ``too_many_token_values`` above it).

    ``POST /rerank``: ``query``, ``texts`` (named so in refusals), ``return_text``, ``raw_scores`` (false: the
    sigmoid of the reranker's logits, as TEI; true: the logits), ``truncate``, ``truncation_direction``
    (``Right`` only). Answer: ``[{"index", "score", "text"?}]``, best first.

    ``POST /similarity`` (and ``POST /`` with an object in ``inputs``: ``InferenceClient.sentence_similarity``):
    ``inputs``: ``{"source_sentence", "sentences"}`` (``sentences`` a list, or one string), ``prompt_name``,
    ``truncate``, ``truncation_direction``. The source and each sentence are embedded together as ``/embed`` embeds
    them; answer: the cosine similarity of each sentence to the source, in order.

    ``POST /tokenize``: ``inputs`` (a string or a list), ``add_special_tokens`` (default true). The texts as the
    model's tokenizer splits them (no instruction, no cut); answer, per text: ``[{"id", "text", "special",
    "start", "stop"}]``, ``start``/``stop`` the token's span in the text's UTF-8 bytes, as TEI counts them (null
    for a special token).

    ``POST /decode``: ``ids`` (a list of token ids, or a list of those), ``skip_special_tokens`` (default true).
    Answer: one string per list of ids.

    ``GET /info``: the model, its limits and the server's version.

Every route refuses a field it does not take with 400 ``unknown_field`` naming it.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmembed.io import is_whole_number
from lmembed.pooling.normalize import unit_rows
from lmembed.serving.errors import bad_request, only_fields, shown, too_many_inputs
from lmembed.serving.schemas import _choice, _dimensions, _model, _texts, text_field

EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
COHERE_INPUT_TYPES = {
    "search_query": "query",
    "search_document": "document",
    "classification": None,
    "clustering": None,
}
TEI_PROMPTS = {"query": "query", "document": "document", "passage": "document"}
#: the fields each route takes (another is refused by name: it would change nothing)
COHERE_EMBED_FIELDS = (
    "texts",
    "images",
    "inputs",
    "model",
    "input_type",
    "embedding_types",
    "output_dimension",
    "max_tokens",
    "truncate",
    "priority",
)
TEI_EMBED_FIELDS = (
    "inputs",
    "normalize",
    "truncate",
    "truncation_direction",
    "prompt_name",
    "dimensions",
    "encoding_format",
)
#: Cohere v2 rerank's fields (``priority``, a scheduling hint, is accepted and has no effect here)
COHERE_RERANK_FIELDS = ("model", "query", "documents", "top_n", "return_documents", "max_tokens_per_doc", "priority")
#: the most numbers (tokens x the model's width) one ``/embed_all`` answer holds: about 40 MB of JSON
MAX_TOKEN_VALUES = 2**22
TEI_EMBED_ALL_FIELDS = ("inputs", "truncate", "truncation_direction", "prompt_name")
TEI_RERANK_FIELDS = ("query", "texts", "truncate", "raw_scores", "return_text", "truncation_direction")
TEI_TOKENIZE_FIELDS = ("inputs", "add_special_tokens", "prompt_name")
TEI_DECODE_FIELDS = ("ids", "skip_special_tokens")


#: Cohere's ``truncate`` values served, as the request's own truncate flag (``START`` is not: texts are cut at
#: their end)
COHERE_TRUNCATE = {"END": True, "NONE": False}


@dataclass(frozen=True)
class CompatEmbedRequest:
    """An embedding request of Cohere v2 or TEI, in lmembed's terms."""

    texts: list[str]
    model: str
    input_type: str | None = None
    dimensions: int | None = None
    embedding_types: tuple[str, ...] = ("float",)
    normalize: bool | None = None  # None: as the strategy says
    truncate: bool | None = None  # TEI's: False refuses a text the model cannot read whole; None: as the server does


def _flag(payload: dict[str, Any], field: str, default: bool) -> bool:
    value = payload.get(field)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{field}' must be true or false, got {shown(value)}", f"invalid_{field}", field)
    return value


def _reads_at_least(payload: dict[str, Any], field: str, max_length: int, what: str) -> None:
    """A per-text token cap is accepted when it cuts nothing the model would read (else 400, saying why)."""
    value = payload.get(field)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"'{field}' must be a positive integer, got {shown(value)}", f"invalid_{field}", field)
    if value < max_length:
        raise bad_request(
            f"'{field}' is {value}; this server does not cut texts shorter than {what} reads ({max_length} tokens): "
            f"leave it out or send {max_length} or more",
            f"invalid_{field}",
            field,
        )


def _priority(payload: dict[str, Any]) -> None:
    """Cohere's ``priority`` (an integer scheduling hint; requests are served in arrival order here): checked."""
    value = payload.get("priority")
    if value is not None and (not is_whole_number(value) or value < 0):
        raise bad_request(f"'priority' must be an integer >= 0, got {shown(value)}", "invalid_priority", "priority")


def parse_cohere_embed(
    payload: dict[str, Any],
    *,
    served: Collection[str],
    default_model: str,
    max_inputs: int,
    dim: int,
    max_length: int,
    fixed_width: str | None = None,
) -> CompatEmbedRequest:
    """Validate a Cohere v2 ``/v2/embed`` body (see the module doc)."""
    only_fields(payload, COHERE_EMBED_FIELDS, "a Cohere v2 embed request")
    for field in ("images", "inputs"):
        if payload.get(field) is not None:
            raise bad_request(f"'{field}' is not served here; send 'texts'", "unsupported_input", field)
    texts = _texts(payload.get("texts"), "texts", max_inputs)
    model = _model(payload, served, default_model)
    input_type = _choice(payload, "input_type", COHERE_INPUT_TYPES, "invalid_input_type")
    types = payload.get("embedding_types")
    types = ["float"] if types is None else types
    if (
        not isinstance(types, list)
        or not types
        or any(not isinstance(t, str) or t not in EMBEDDING_TYPES for t in types)
    ):
        raise bad_request(
            f"'embedding_types' must be a non-empty list of {', '.join(EMBEDDING_TYPES)}, got {shown(types)}",
            "invalid_embedding_types",
            "embedding_types",
        )
    dimensions = _dimensions(payload, "output_dimension", dim, fixed_width)
    if {"binary", "ubinary"} & set(types) and (dimensions or dim) % 8:
        raise bad_request(
            f"binary embeddings pack 8 dimensions per byte; {dimensions or dim} dimensions do not divide by 8",
            "invalid_embedding_types",
            "embedding_types",
        )
    truncate = payload.get("truncate")  # absent: what this server does (a long text is then cut, or refused by name)
    if truncate is not None and (not isinstance(truncate, str) or truncate not in COHERE_TRUNCATE):
        raise bad_request(
            f"'truncate' is {shown(truncate)}; send END (a long text is cut at its end) or NONE (a long text is "
            "refused); START is not served",
            "invalid_truncate",
            "truncate",
        )
    _reads_at_least(payload, "max_tokens", max_length, "the model")
    _priority(payload)
    side = COHERE_INPUT_TYPES.get(input_type) if input_type is not None else None
    cut = None if truncate is None else COHERE_TRUNCATE[truncate]
    return CompatEmbedRequest(texts, model, side, dimensions, tuple(dict.fromkeys(types)), truncate=cut)


def quantise(vectors: np.ndarray, kind: str) -> list[Any]:
    """``vectors`` as Cohere's embedding type ``kind`` (see the module doc for the scales)."""
    vectors = np.ascontiguousarray(vectors, dtype="<f4")
    if kind == "float":
        return vectors.tolist()
    if kind == "base64":
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
    if kind in ("int8", "uint8"):
        peak = np.maximum(np.abs(vectors).max(axis=1, keepdims=True), 1e-12)
        q = np.clip(np.rint(vectors / peak * 127), -127, 127).astype(np.int16)
        return (q if kind == "int8" else q + 128).tolist()
    packed = np.packbits(vectors > 0, axis=1).astype(np.int16)  # ubinary
    return (packed if kind == "ubinary" else packed - 128).tolist()


def cohere_embed_body(req: CompatEmbedRequest, vectors: np.ndarray, tokens: int) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_by_type",
        "embeddings": {kind: quantise(vectors, kind) for kind in req.embedding_types},
        "texts": req.texts,
        "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}},
    }


def cohere_rerank_checks(payload: dict[str, Any], max_length: int) -> None:
    """Cohere v2's extra rerank fields (the rest is ``/v1/rerank``'s schema)."""
    _reads_at_least(payload, "max_tokens_per_doc", max_length, "the reranker")
    _priority(payload)


def cohere_rerank_body(order: list[int], scores: np.ndarray, documents: list[str] | None, tokens: int) -> dict:
    results: list[dict[str, Any]] = []
    for i in order:
        item: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if documents is not None:
            item["document"] = {"text": documents[i]}
        results.append(item)
    meta = {"api_version": {"version": "2"}, "billed_units": {"search_units": 1, "input_tokens": tokens}}
    return {"id": str(uuid.uuid4()), "results": results, "meta": meta}


def _direction(payload: dict[str, Any]) -> None:
    direction = payload.get("truncation_direction")
    if direction is not None and str(direction).lower() != "right":
        raise bad_request(
            f"'truncation_direction' is {shown(direction)}; this server cuts long texts on the right only",
            "invalid_truncation_direction",
            "truncation_direction",
        )


def parse_tei_embed(
    payload: dict[str, Any], *, default_model: str, max_inputs: int, dim: int, fixed_width: str | None = None
) -> CompatEmbedRequest:
    """Validate a TEI ``/embed`` body (see the module doc)."""
    only_fields(payload, TEI_EMBED_FIELDS, "a TEI embed request")
    texts = _texts(payload.get("inputs"), "inputs", max_inputs)
    normalize = _flag(payload, "normalize", True)
    if not normalize and fixed_width is not None:
        raise bad_request(
            f"'normalize' must be true or absent for this model: its vectors cannot be left unnormalised "
            f"({fixed_width})",
            "invalid_normalize",
            "normalize",
        )
    truncate = payload.get("truncate")
    if truncate is not None:
        _flag(payload, "truncate", False)
    _direction(payload)
    _choice(payload, "encoding_format", ("float",), "invalid_encoding_format")
    prompt = _choice(payload, "prompt_name", TEI_PROMPTS, "invalid_prompt_name")
    dimensions = _dimensions(payload, "dimensions", dim, fixed_width)
    side = TEI_PROMPTS.get(prompt) if prompt is not None else None
    return CompatEmbedRequest(texts, default_model, side, dimensions, ("float",), normalize, truncate)


def parse_tei_embed_all(payload: dict[str, Any], *, default_model: str, max_inputs: int) -> CompatEmbedRequest:
    """Validate a TEI ``/embed_all`` body (see the module doc)."""
    only_fields(payload, TEI_EMBED_ALL_FIELDS, "a TEI embed_all request")
    texts = _texts(payload.get("inputs"), "inputs", max_inputs)
    truncate = payload.get("truncate")
    if truncate is not None:
        _flag(payload, "truncate", False)
    _direction(payload)
    prompt = _choice(payload, "prompt_name", TEI_PROMPTS, "invalid_prompt_name")
    side = TEI_PROMPTS.get(prompt) if prompt is not None else None
    return CompatEmbedRequest(texts, default_model, side, truncate=truncate)


def token_states_body(states: list[np.ndarray]) -> bytes:
    """TEI's ``/embed_all`` answer: per text, per token, its vector."""
    return json.dumps([s.tolist() for s in states]).encode()


def parse_tei_rerank(payload: dict[str, Any]) -> dict[str, Any]:
    """A TEI ``/rerank`` body as a ``/v1/rerank`` body whose documents are in ``texts`` (read with
    ``documents_field="texts"``, so refusals name TEI's field), its own fields checked; ``raw_scores`` (true: the
    reranker's logits, false, the default: their sigmoid) rides along for the route to take out."""
    only_fields(payload, TEI_RERANK_FIELDS, "a TEI rerank request")
    raw = _flag(payload, "raw_scores", False)
    _flag(payload, "truncate", False)
    _direction(payload)
    return_text = _flag(payload, "return_text", False)
    if "texts" not in payload:
        raise bad_request("'texts' is required", "missing_input", "texts")
    return {
        "query": payload.get("query"),
        "texts": payload.get("texts"),
        "return_documents": return_text,
        "raw_scores": raw,
    }


def tei_rerank_body(order: list[int], scores: np.ndarray, documents: list[str], return_text: bool) -> list[dict]:
    out = []
    for i in order:
        item: dict[str, Any] = {"index": i, "score": float(scores[i])}
        if return_text:
            item["text"] = documents[i]
        out.append(item)
    return out


@dataclass(frozen=True)
class SimilarityRequest:
    """A TEI ``/similarity`` request: the source sentence, the sentences to compare with it, and their side."""

    source: str
    sentences: list[str]
    side: str | None = None


SIMILARITY_FIELDS = ("inputs", "parameters", "prompt_name", "truncate", "truncation_direction")


def parse_tei_similarity(payload: dict[str, Any], *, max_inputs: int) -> SimilarityRequest:
    """Validate a TEI ``/similarity`` body (see the module doc); the source and its sentences count as texts against
    ``max_inputs``, and a field of ``/embed`` that would change the vectors (``dimensions``, ``normalize``) is refused
    rather than ignored."""
    only_fields(payload, SIMILARITY_FIELDS, "a similarity request")
    inputs = payload.get("inputs")
    if not isinstance(inputs, dict):
        raise bad_request(
            "'inputs' must be an object with 'source_sentence' (a string) and 'sentences' (a list of strings)",
            "invalid_input",
            "inputs",
        )
    extra = sorted(set(inputs) - {"source_sentence", "sentences"})
    if extra:
        raise bad_request(f"'inputs.{extra[0]}' is not a field of a similarity request", "invalid_input", "inputs")
    source = inputs.get("source_sentence")
    field = "inputs.source_sentence"
    if source is None:
        raise bad_request(f"'{field}' is required", "missing_input", field)
    source = text_field(source, field)
    sentences = _texts(inputs.get("sentences"), "inputs.sentences", max_inputs)  # a string: one sentence
    if len(sentences) + 1 > max_inputs:
        raise too_many_inputs("inputs", len(sentences) + 1, max_inputs, "texts (the source and its sentences)")
    parameters = payload.get("parameters")
    if parameters is not None and (not isinstance(parameters, dict) or parameters):
        raise bad_request(
            f"'parameters' takes no field here, got {shown(parameters)}; send prompt_name or truncate beside 'inputs'",
            "invalid_parameters",
            "parameters",
        )
    _flag(payload, "truncate", False)
    _direction(payload)
    prompt = _choice(payload, "prompt_name", TEI_PROMPTS, "invalid_prompt_name")
    return SimilarityRequest(source, sentences, TEI_PROMPTS.get(prompt) if prompt is not None else None)


def similarity_body(vectors: np.ndarray) -> list[float]:
    """The cosine similarity of each row after the first to the first (``vectors``: the source, then the rest)."""
    unit = unit_rows(vectors, dtype=None)
    return (unit[1:] @ unit[0]).astype(float).tolist()


@dataclass(frozen=True)
class TokenizeRequest:
    texts: list[str]
    add_special_tokens: bool = True


def parse_tei_tokenize(payload: dict[str, Any], *, max_inputs: int) -> TokenizeRequest:
    """Validate a TEI ``/tokenize`` body (see the module doc)."""
    only_fields(payload, TEI_TOKENIZE_FIELDS, "a TEI tokenize request")
    if payload.get("prompt_name") is not None:
        raise bad_request(
            "'prompt_name' is not served on /tokenize: it shows a text as the tokenizer splits it, without a prompt",
            "invalid_prompt_name",
            "prompt_name",
        )
    texts = _texts(payload.get("inputs"), "inputs", max_inputs)
    return TokenizeRequest(texts, _flag(payload, "add_special_tokens", True))


@dataclass(frozen=True)
class DecodeRequest:
    ids: list[list[int]]
    skip_special_tokens: bool = True


def parse_tei_decode(payload: dict[str, Any], *, max_inputs: int, vocab_size: int) -> DecodeRequest:
    """Validate a TEI ``/decode`` body (see the module doc): every id an integer the tokenizer knows."""
    only_fields(payload, TEI_DECODE_FIELDS, "a TEI decode request")
    ids = payload.get("ids")
    if ids is None:
        raise bad_request("'ids' is required", "missing_input", "ids")
    if isinstance(ids, list) and ids and all(isinstance(row, list) for row in ids):
        rows = ids
    elif isinstance(ids, list):
        rows = [ids]
    else:
        raise bad_request("'ids' must be a list of token ids or a list of such lists", "invalid_ids", "ids")
    if len(rows) > max_inputs:
        raise too_many_inputs("ids", len(rows), max_inputs, "lists")
    for i, row in enumerate(rows):
        if not row:  # as TEI: there is nothing to decode
            where = f"ids[{i}]" if len(rows) > 1 or ids is not rows[0] else "ids"
            raise bad_request(f"'{where}' is an empty list; send the token ids to decode", "empty_input", "ids")
    for i, row in enumerate(rows):
        for j, token in enumerate(row):
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
                where = f"ids[{i}][{j}]" if len(rows) > 1 or ids is not rows[0] else f"ids[{j}]"
                raise bad_request(
                    f"'{where}' is {shown(token)}; a token id is an integer from 0 to {vocab_size - 1}",
                    "invalid_ids",
                    "ids",
                )
    return DecodeRequest(rows, _flag(payload, "skip_special_tokens", True))
