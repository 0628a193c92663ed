"""The embedding server: any saved Embedder behind an OpenAI-compatible HTTP API (``lmembed serve``).

=============== =====================================================================
module          holds
=============== =====================================================================
``app``         :func:`create_app`: the FastAPI application (embeddings, search, models, health, metrics)
``batcher``     the scheduler: first come first served, forward passes by a token budget, shared by callers
``tokens``      token counting and the length check, off the event loop
``limits``      :class:`Limits` and the middleware that enforces them (auth, size, concurrency)
``schemas``     request parsing and validation, response bodies
``errors``      :class:`ApiError` and the JSON error body ``{"error": {"message", "type", "code"}}``
``metrics``     the Prometheus metrics of one server
``server``      running the app with uvicorn: in the foreground, or in a background thread
=============== =====================================================================

Needs the ``serve`` extra (``pip install lmembed[serve]``): FastAPI, uvicorn, prometheus-client.
"""
