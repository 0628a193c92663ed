"""The CLI writes some defaults of the library's dataclasses again as option defaults (importing those classes would
load FAISS or the server's stack for ``--help``). These tests keep the two from drifting apart: a default changed in
one place and not the other fails here."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from lmembed.cli import evaluate, index, serve
from lmembed.encoding.chunking import Chunking
from lmembed.index.kinds import IndexParams
from lmembed.serving.limits import Limits


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def _option_default(command: Callable[..., Any], name: str) -> Any:
    return inspect.signature(inspect.unwrap(command)).parameters[name].default


# (command, its parameter, the dataclass, its field, how the option's unit becomes the field's)
LIMITS_SAME_NAME = "max_batch_tokens window_share workers max_request_bytes max_concurrent_requests max_inputs"
LIMITS_SAME_NAME += " max_header_bytes max_connections_per_client max_tokens_in_flight public_metrics"
INDEX_SAME_NAME = "kind hnsw_m ef_construction ef_search nlist pq_m nprobe rescore rescore_multiplier"
SAME = [
    *[(serve.serve, name, Limits, name, None) for name in LIMITS_SAME_NAME.split()],
    (serve.serve, "batch_wait_ms", Limits, "batch_wait_s", lambda ms: ms / 1000),
    (serve.serve, "body_timeout", Limits, "body_timeout_s", None),
    (serve.serve, "no_truncate", Limits, "truncate", lambda no: not no),
    *[(index.build, name, IndexParams, name, None) for name in INDEX_SAME_NAME.split()],
    *[
        (cmd, f"chunk_{name}", Chunking, name, None)
        for cmd in (index.build, evaluate.eval_command)
        for name in ("tokens", "overlap")
    ],
]


@pytest.mark.parametrize(
    ("command", "option", "cls", "field", "convert"), SAME, ids=[f"{c.__name__}-{o}" for c, o, *_ in SAME]
)
def test_a_cli_option_defaults_to_what_its_dataclass_does(command, option, cls, field, convert):
    given = _option_default(command, option)
    assert (convert(given) if convert else given) == _defaults(cls)[field], (command.__name__, option)
