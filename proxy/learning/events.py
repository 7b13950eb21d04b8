"""What the learning worker reports: metric counts and the audit events of a batch.

``count(event, label)`` adds one to ``memory_proxy_learning_events_total{event, label}``
(nothing without metrics); :func:`batch_event` is an automatic audit event about a batch,
carrying the batch key in its detail.
"""

from __future__ import annotations

from datetime import datetime

from proxy.learning.queue import Batch
from proxy.memory.store import AuditEvent
from proxy.metrics import Metrics


class Counter:
    """``learning_events`` counts, or nothing when the worker runs without metrics."""

    def __init__(self, metrics: Metrics | None) -> None:
        self._metrics = metrics

    def __call__(self, event: str, label: str) -> None:
        if self._metrics is not None:
            self._metrics.learning_events.labels(event=event, label=label).inc()


def batch_event(batch: Batch, action: str, reason: str, at: datetime,
                detail: dict[str, object] | None = None, *,
                owner: str | None = None) -> AuditEvent:
    """An ``auto`` audit event of ``batch`` (its user, or ``owner``), detail ``batch``."""
    return AuditEvent(
        tenant=batch.tenant, user_id=owner or batch.user,
        action=action,  # type: ignore[arg-type]
        actor="auto", at=at, conversation_id=batch.conversation, reason=reason,
        detail={"batch": batch.key, **(detail or {})},
    )
