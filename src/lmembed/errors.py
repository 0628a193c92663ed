"""The root of lmembed's user-facing errors, and the general ones shared across the package.

Every error lmembed raises on purpose for a user mistake (a bad option, an unusable model, a malformed
file, a bad input text) derives from :class:`LmembedError`, so the command line can catch that one class and
print a single line instead of a traceback. Each concrete error also keeps a builtin base that says what
kind of problem it is (``ValueError``, ``RuntimeError``, ...), so ``except ValueError`` handlers keep working.

Errors that belong to one subsystem live next to it (e.g. ``lmembed.models.attention.AttentionError``)
and derive from :class:`LmembedError` too.
"""

from __future__ import annotations


class LmembedError(Exception):
    """Base class of the errors lmembed raises for user-facing problems."""


class ConfigError(LmembedError, ValueError):
    """An option has a value lmembed does not understand (also ``lmembed.config.ConfigError``)."""


class ModelLoadError(LmembedError, ValueError):
    """A model cannot be loaded or used as asked (also ``lmembed.models.loading.ModelLoadError``)."""


class InputError(LmembedError, ValueError):
    """Texts given to encode are not usable (also ``lmembed.encoding.inputs.InputError``)."""


__all__ = ["ConfigError", "InputError", "LmembedError", "ModelLoadError"]
