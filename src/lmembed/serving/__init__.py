"""The embedding server: any saved Embedder behind an OpenAI-compatible HTTP API, and Cohere v2's and TEI's
(``lmembed serve``).

=============== =====================================================================
module          holds
=============== =====================================================================
``app``         :func:`create_app`: the FastAPI application (embeddings, search, models, health, metrics)
``batcher``     the scheduler: first come first served, forward passes by a token budget, shared by callers
``tokens``      token counting and the length check, off the event loop
``limits``      :class:`Limits` and the middleware that enforces them (auth, size, concurrency)
``schemas``     request parsing and validation (the JSON depth bound), response bodies
``compat``      Cohere v2 and Text Embeddings Inference requests and responses (``/v2/*``, ``/embed``, ...)
``rerank``      the served reranker: ``/v1/rerank`` and reranked search, its pairs batched by tokens
``memory``      freed heap memory handed back to the system when the server is idle after large requests
``errors``      :class:`ApiError` and the JSON error body ``{"error": {"message", "type", "code"}}``
``metrics``     the Prometheus metrics of one server
``server``      running the app with uvicorn: in the foreground, or in a background thread
=============== =====================================================================

Needs the ``serve`` extra (``pip install lmembed[serve]``): FastAPI, uvicorn, prometheus-client.
"""
