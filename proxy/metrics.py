"""Prometheus metrics, one registry per app (no module-level collectors).

Names follow Prometheus conventions (``_total`` counters, ``_seconds`` histograms). TTFT is
the time from the request's arrival to the first byte the upstream streamed back.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Latency buckets (seconds) from 1 ms to 60 s: the gateway's own work sits in the low
# milliseconds, upstream TTFT in hundreds of ms to tens of seconds.
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKENS = (0, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12800)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "memory_proxy_requests_total", "Chat completion requests by outcome.",
            ["model", "stream", "status"], registry=r)
        self.request_seconds = Histogram(
            "memory_proxy_request_seconds", "Gateway time to response headers.",
            ["stream"], buckets=_LATENCY, registry=r)
        self.recall_seconds = Histogram(
            "memory_proxy_recall_seconds", "Memory recall + ranking time on the hot path.",
            buckets=_LATENCY, registry=r)
        self.upstream_ttft_seconds = Histogram(
            "memory_proxy_upstream_ttft_seconds", "Request arrival to first upstream byte.",
            ["model"], buckets=_LATENCY, registry=r)
        self.memory_outcomes = Counter(
            "memory_proxy_memory_outcomes_total", "What memory did per request.",
            ["status", "reason"], registry=r)
        self.injected_tokens = Histogram(
            "memory_proxy_injected_tokens", "Tokens of the injected memory block.",
            buckets=_TOKENS, registry=r)
        self.tokens = Counter(
            "memory_proxy_tokens_total", "Tokens by ledger (user, memory, learning).",
            ["ledger", "kind"], registry=r)
        self.learning_events = Counter(
            "memory_proxy_learning_events_total", "Learning pipeline events.",
            ["event", "label"], registry=r)
        self.queue_depth = Gauge(
            "memory_proxy_learning_queue_depth", "Learning jobs by state.", ["state"],
            registry=r)
        self.event_loop_tasks = Gauge(
            "memory_proxy_event_loop_tasks",
            "asyncio tasks alive on the event loop, counted at scrape time (leak check).",
            registry=r)
        self.sink_dropped = Counter(
            "memory_proxy_learning_sink_dropped_total",
            "Exchanges not queued because the in-process buffer was full.", registry=r)
        # Issue 13: learning budgets. 1 while the tenant's learning is paused by its
        # budget (set by the worker when it checks, and by GET /v1/admin/stats), else 0.
        self.learning_budget_paused = Gauge(
            "memory_proxy_learning_budget_paused",
            "1 while a tenant's learning budget (learning.budget) is spent, else 0.",
            ["tenant"], registry=r)
        self.learning_budget_spent_tokens = Gauge(
            "memory_proxy_learning_budget_spent_tokens",
            "Learning tokens a tenant spent in the current UTC period, at the last check.",
            ["tenant", "period"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
