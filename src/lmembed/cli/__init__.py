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
"""

from lmembed.cli.app import app, main

__all__ = ["app", "main"]
