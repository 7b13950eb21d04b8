"""``metrics``: what ``GET /metrics`` (no key: scrapers) may show
(docs/design.md#metrics)."""

from __future__ import annotations

from proxy.settings.base import Section


class MetricsSettings(Section):
    """``metrics.tenant_labels``: ``false`` (the default) — no tenant name appears in
    ``/metrics``: the per-tenant learning-budget gauges keep their names and their
    ``tenant`` label, set to the constant :data:`~proxy.metrics.ALL_TENANTS`, and hold
    every tenant together (paused: 1 while any tenant's budget is spent; spent tokens: the
    sum of the tenants' last readings). ``true`` — one series per tenant, named by the
    tenant, for an operator who scrapes on a private network."""

    tenant_labels: bool = False
