"""The Prometheus metrics of one server (a registry of its own, so several servers can live in one process).

=================================== ==========================================================================
metric                              what it counts
=================================== ==========================================================================
``lmembed_requests_total``          HTTP requests by endpoint and status code
``lmembed_errors_total``            error responses by status and error code (``too_many_inputs`` ...)
``lmembed_request_latency_seconds`` request latency by endpoint (histogram)
``lmembed_requests_in_flight``      requests being handled now
``lmembed_queue_depth``             texts waiting for a forward pass
``lmembed_batch_tokens``            padded tokens (texts x longest) per forward pass (histogram)
``lmembed_batch_texts``             texts per forward pass (histogram)
``lmembed_forward_seconds``         time of one forward pass (histogram)
``lmembed_embedded_texts_total``    texts embedded
``lmembed_prompt_tokens_total``     tokens embedded (as reported in ``usage``)
=================================== ==========================================================================
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = tuple(2.0**i for i in range(4, 19))
TEXT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class ServerMetrics:
    """Counters, gauges and histograms of one server; :meth:`render` is the ``/metrics`` body."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("lmembed_requests", "HTTP requests", ["endpoint", "status"], registry=r)
        self.errors = Counter("lmembed_errors", "Error responses", ["status", "code"], registry=r)
        self.latency = Histogram(
            "lmembed_request_latency_seconds", "Request latency", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.in_flight = Gauge("lmembed_requests_in_flight", "Requests being handled", registry=r)
        self.queue_depth = Gauge("lmembed_queue_depth", "Texts waiting for a forward pass", registry=r)
        self.batch_tokens = Histogram(
            "lmembed_batch_tokens", "Padded tokens per forward pass", buckets=TOKEN_BUCKETS, registry=r
        )
        self.batch_texts = Histogram("lmembed_batch_texts", "Texts per forward pass", buckets=TEXT_BUCKETS, registry=r)
        self.forward_seconds = Histogram(
            "lmembed_forward_seconds", "Time of one forward pass", buckets=LATENCY_BUCKETS, registry=r
        )
        self.texts = Counter("lmembed_embedded_texts", "Texts embedded", registry=r)
        self.tokens = Counter("lmembed_prompt_tokens", "Tokens embedded", registry=r)

    def error(self, status: int, code: str) -> None:
        self.errors.labels(status=str(status), code=code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
