"""Prometheus metrics, one registry per app (no module-level collectors).

Names follow Prometheus conventions (``_total`` counters, ``_seconds`` histograms). TTFT is
the time from the request's arrival to the first byte the upstream streamed back.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Latency buckets (seconds) from 1 ms to 60 s: the gateway's own work sits in the low
# milliseconds, upstream TTFT in hundreds of ms to tens of seconds.
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKENS = (0, 50, 100, 200, 400, 800, 1600, 3200, 6400, 12800)
# The ``tenant`` label's value while ``metrics.tenant_labels`` is off: every tenant together
# (a value no configured tenant is expected to be called; it names none).
ALL_TENANTS = "*"


class Metrics:
    """Every collector of one app. ``tenant_labels`` (``metrics.tenant_labels``, default
    off): whether a tenant's name may appear as a label value (:meth:`learning_budget`)."""

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 tenant_labels: bool = False) -> None:
        self.registry = registry or CollectorRegistry()
        self.tenant_labels = tenant_labels
        # tenant → (paused, spent today, spent this month): the last reading of each, summed
        # into the ALL_TENANTS series while tenant labels are off.
        self._budgets: dict[str, tuple[bool, int, int]] = {}
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
        # Gauges read at scrape time from the shared queue: with several processes
        # (serve --processes) the most recent reading is the value.
        self.queue_depth = Gauge(
            "memory_proxy_learning_queue_depth", "Learning jobs by state.", ["state"],
            registry=r, multiprocess_mode="mostrecent")
        self.queue_jobs = Gauge(
            "memory_proxy_learning_queue_jobs", "Learning jobs by kind and state.",
            ["kind", "state"], registry=r, multiprocess_mode="mostrecent")
        self.event_loop_tasks = Gauge(
            "memory_proxy_event_loop_tasks",
            "asyncio tasks alive on the event loop, counted at scrape time (leak check).",
            registry=r, multiprocess_mode="liveall")
        self.sink_dropped = Counter(
            "memory_proxy_learning_sink_dropped_total",
            "Exchanges not queued because the in-process buffer was full.", registry=r)
        # Learning budgets. 1 while the tenant's learning is paused by its
        # budget (set by the worker when it checks, and by GET /v1/admin/stats), else 0;
        # written through learning_budget only (tenant names only with tenant_labels).
        self.learning_budget_paused = Gauge(
            "memory_proxy_learning_budget_paused",
            "1 while a tenant's learning budget (learning.budget) is spent, else 0.",
            ["tenant"], registry=r)
        self.learning_budget_spent_tokens = Gauge(
            "memory_proxy_learning_budget_spent_tokens",
            "Learning tokens a tenant spent in the current UTC period, at the last check.",
            ["tenant", "period"], registry=r)

        self.memory_lines_refused = Counter(
            "memory_proxy_memory_lines_refused_total",
            "Stored memory lines left out of the injected block because their text poses "
            "as an instruction (an order, a link, a role or tool-call marker).", registry=r)

        # Deploy and operate -----------------------------------------------------------
        self.http_requests = Counter(
            "memory_proxy_http_requests_total",
            "HTTP requests by route template, method and status (every route).",
            ["route", "method", "status"], registry=r)
        self.http_request_seconds = Histogram(
            "memory_proxy_http_request_seconds",
            "Request arrival to the end of the response body (streams: the whole stream).",
            ["route"], buckets=_LATENCY, registry=r)
        self.oldest_job_age = Gauge(
            "memory_proxy_learning_oldest_job_age_seconds",
            "Seconds the oldest claimable learning job has waited (0: none waits); read "
            "at scrape time.", registry=r, multiprocess_mode="mostrecent")
        self.spool_items = Gauge(
            "memory_proxy_spool_items",
            "Items buffered in this process before a write: learning_sink (turns waiting "
            "to be queued), usage (ledger rows waiting for the next flush).",
            ["spool"], registry=r, multiprocess_mode="livesum")
        self.store_errors = Counter(
            "memory_proxy_store_errors_total",
            "Storage calls that failed (StoreUnavailableError) by operation, e.g. "
            "store.search, queue.claim, ledger.record_usage.",
            ["operation"], registry=r)
        self.store_pool_exhausted = Counter(
            "memory_proxy_store_pool_exhausted_total",
            "Storage commands that found no free connection in the pool within its "
            "bounded wait (Redis busy, or storage.redis_max_connections too small); not "
            "an outage.", registry=r)
        self.event_loop_lag = Counter(
            "memory_proxy_event_loop_lag_seconds_total",
            "Seconds the event loop ran late: a 10 ms heartbeat's lateness, summed (other "
            "work ready before it, or the process waiting for a CPU). Recall's deadline "
            "does not count this time (docs/design.md#recall-deadline).", registry=r)
        self.alerts = Counter(
            "memory_proxy_alerts_total",
            "Alert webhook deliveries by alert and state (firing, resolved) and outcome "
            "(sent, failed).", ["alert", "state", "outcome"], registry=r)

    def learning_budget(self, tenant: str, *, paused: bool, spent_today: int | None = None,
                        spent_this_month: int | None = None) -> None:
        """Record a tenant's budget reading in the two budget gauges. With tenant labels the
        series is the tenant's; without, the ``tenant`` label is :data:`ALL_TENANTS` and
        the gauges hold every tenant together: paused is 1 while any tenant is paused,
        spent tokens the sum of each tenant's last reading (``None``: unchanged; a tenant
        without a cap reads 0)."""
        _, today, month = self._budgets.get(tenant, (False, 0, 0))
        today = today if spent_today is None else spent_today
        month = month if spent_this_month is None else spent_this_month
        self._budgets[tenant] = (paused, today, month)
        if self.tenant_labels:
            label, values = tenant, [(paused, today, month)]
        else:
            label, values = ALL_TENANTS, list(self._budgets.values())
        self.learning_budget_paused.labels(tenant=label).set(
            int(any(p for p, _, _ in values)))
        if spent_today is not None or spent_this_month is not None:
            spent = self.learning_budget_spent_tokens
            spent.labels(tenant=label, period="day").set(sum(d for _, d, _ in values))
            spent.labels(tenant=label, period="month").set(sum(m for _, _, m in values))

    def render(self) -> bytes:
        """The exposition text. With ``PROMETHEUS_MULTIPROC_DIR`` set (``serve
        --processes N``) every process's values are read from that directory and merged
        (prometheus-client's multiprocess mode), so any process answers for all."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return generate_latest(merged)
        return generate_latest(self.registry)
