"""The errors a sharded job raises: a bad input row, a worker lost for good, a missing Ray install."""

from __future__ import annotations

from lmembed.errors import LmembedError


class ScaleError(LmembedError, RuntimeError):
    """A sharded encoding job cannot go on (the message says why and what is kept)."""


class BadRowError(LmembedError, ValueError):
    """One input row cannot be encoded; the message names it (file:line or row, and its id)."""


class WorkerLostError(ScaleError):
    """A worker died and was not brought back within the allowed restarts; finished shards are kept."""


class EngineUnavailableError(LmembedError, ImportError):
    """The requested engine needs a package that is not installed (the message gives the pip command)."""


__all__ = ["BadRowError", "EngineUnavailableError", "ScaleError", "WorkerLostError"]
