"""``python -m lmembed.cli``: the same program as the ``lmembed`` command."""

from lmembed.cli.app import main

main()
