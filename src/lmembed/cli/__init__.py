"""The ``lmembed`` command line: a thin layer over the Python API, one module per command group.

=============== =====================================================================
module          commands
=============== =====================================================================
``app``         the root ``lmembed`` group; registers every command below
``options``     options shared by several commands (help text, validation, loaders)
``boundary``    the one error boundary: a short message and an exit status, no traceback
``encode``      ``lmembed encode``
``models``      ``lmembed models``
``cache``       ``lmembed cache info|clear``
``evaluate``    ``lmembed eval`` (no arguments: the main job), ``sweep``, ``report``
``train``       ``lmembed train`` (``python -m lmembed.cli.train`` for ``accelerate launch``)
``mine``        ``lmembed mine``
=============== =====================================================================

Adding a command: a module-level function in the module of its group, registered in ``app.py``.

The package imports none of them: ``python -m lmembed.cli.train`` (what ``accelerate launch`` runs) has to find
``lmembed.cli.train`` not yet imported. ``main`` (the ``lmembed`` program) is imported on first use.
"""

from collections.abc import Callable
from typing import Any


def __getattr__(name: str) -> Callable[[], Any]:
    if name == "main":
        from lmembed.cli.app import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
