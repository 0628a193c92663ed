"""Turning texts into vectors: input building (instructions, echo, truncation; ``inputs``), the batched
forward-and-pool engine (``engine``) and the on-disk embedding cache it fills as it goes (``cache``)."""
