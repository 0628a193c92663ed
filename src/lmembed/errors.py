"""The root of lmembed's user-facing errors, and the general ones shared across the package.

Every error lmembed raises on purpose for a user mistake (a bad option, an unusable model, a malformed
file, a bad input text) derives from :class:`LmembedError`, so the command line can catch that one class and
print a single line instead of a traceback. Each concrete error also keeps a builtin base that says what
kind of problem it is (``ValueError``, ``RuntimeError``, ...), so ``except ValueError`` handlers keep working.

Errors that belong to one subsystem live next to it (e.g. ``lmembed.models.attention.AttentionError``)
and derive from :class:`LmembedError` too.

The command line treats an ``LmembedError`` as the user's mistake (exit 2, one line) and any other
exception as a bug (exit 1, "internal error"). So where a user's value or file can make a builtin or a
library raise (``int()`` of an option, ``json``/``yaml`` parsing, a model config transformers refuses),
catch it at that place and raise one of these, naming the file and line, the argument or the field.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


def _rebuild(cls: type[LmembedError], args: tuple, state: dict) -> LmembedError:
    """Unpickle an lmembed error without calling its ``__init__`` (whose signature may differ from ``args``)."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class LmembedError(Exception):
    """Base class of the errors lmembed raises for user-facing problems.

    Every one pickles whole, whatever its ``__init__`` takes, so an error raised in a Ray worker or a
    subprocess arrives in the driver as the same error with the same message and attributes."""

    def __reduce__(self) -> tuple:
        return _rebuild, (type(self), self.args, dict(self.__dict__))


class ConfigError(LmembedError, ValueError):
    """An option has a value lmembed does not understand (also ``lmembed.config.ConfigError``)."""


class ModelLoadError(LmembedError, ValueError):
    """A model cannot be loaded or used as asked (also ``lmembed.models.loading.ModelLoadError``)."""


class InputError(LmembedError, ValueError):
    """Texts given to encode are not usable (also ``lmembed.encoding.inputs.InputError``)."""


class UnknownNameError(LmembedError, KeyError):
    """A name (a suite, a task type, a loss, an instruction set, an arm) is not among the known ones; the
    message lists those."""

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class UnsafeFileError(LmembedError, ValueError):
    """A folder names a path that leaves it (an absolute path, ``..``, a link to elsewhere); refused before it is
    opened (see :func:`lmembed.paths.inside`)."""


__all__ = ["ConfigError", "InputError", "LmembedError", "ModelLoadError", "UnknownNameError", "UnsafeFileError"]


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or a service manager's stop), raised as an interrupt: work in progress is flushed,
    and child processes are ended, as for Ctrl-C."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (by default it ends the process at
    once: caches unflushed, children left running); elsewhere, and after the block, it is as it was."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
