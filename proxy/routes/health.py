"""Liveness, readiness and metrics.

``/healthz`` answers 200 while the process runs. ``/readyz`` reports each dependency; it
answers 200 whenever chat can be served — a memory store outage degrades memory, not chat
(docs/design.md#storage), so it shows as ``"degraded"`` with 200 — and 503 only when no model is
configured, or while the process drains after SIGTERM (``"draining"``, so load balancers
stop sending it requests). ``checks.learning`` is ``off``, ``on``, or ``stopped`` when the
learning worker this process runs has ended (also ``"degraded"``: chat goes on, learning
does not). ``checks.spool`` shows what this process holds in memory because the store could
not be written: finished turns and learning jobs waiting to be queued, usage rows waiting
for the ledger, and how many were dropped past the buffers' caps since start
(``"degraded"`` while anything waits on a failing store or anything was dropped).
"""

from __future__ import annotations

import asyncio

import structlog
from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.memory.store import StoreBusyError
from proxy.resources import Resources
from proxy.routes.json import json_response
from proxy.routes.shapes import Healthz, Readyz

log = structlog.get_logger("proxy.health")
# Seconds /readyz waits for the store's ping and the queue's depth (asked at once): a
# probe answers within a second whatever the store does (load balancers' probes time out
# at 1 s by default).
READY_TIMEOUT_SECONDS = 0.5


async def healthz(_request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    res: Resources = request.app.state.resources
    checks: dict[str, object] = {}
    # Store and queue are asked at once, each under READY_TIMEOUT_SECONDS: a store that
    # stopped answering costs /readyz that long, not the socket timeout per read.
    store, queue = await asyncio.gather(_store_check(res), _queue_check(res))
    checks["store"] = store
    if queue is not None:
        checks["learning_queue"] = queue
    checks["models"] = len(res.registry.names)
    checks["embedder"] = res.embedder.model if res.embedder is not None else "none"
    checks["learning"] = _learning(res)
    spool = res.sink.spool()
    checks["spool"] = {
        "pending_turns": spool.pending_turns, "unwritten_jobs": spool.unwritten_jobs,
        "dropped_turns": spool.dropped_turns, "failing_since": spool.failing_since,
        "pending_usage_rows": res.usage.pending, "dropped_usage_rows": res.usage.dropped,
    }
    spooling = spool.unwritten_jobs > 0 or spool.dropped_turns > 0 or res.usage.dropped > 0
    if not res.registry.names:
        return json_response({"status": "unavailable", "checks": checks}, status_code=503)
    if res.drain.draining:  # SIGTERM: take this instance out of the load balancer
        return json_response({"status": "draining", "checks": checks}, status_code=503)
    degraded = checks["store"] != "ok" or isinstance(checks.get("learning_queue"), str) \
        or checks["learning"] == "stopped" or spooling
    return json_response({"status": "degraded" if degraded else "ok", "checks": checks})


async def _store_check(res: Resources) -> str:
    """``ok``; ``busy`` (reachable, no free connection in time); ``unavailable: <Error>``."""
    try:
        async with asyncio.timeout(READY_TIMEOUT_SECONDS):
            await res.store.ping()
    except StoreBusyError:
        return "busy"
    except Exception as exc:  # any failure is reported, none is raised
        return f"unavailable: {type(exc).__name__}"
    return "ok"


async def _queue_check(res: Resources) -> dict[str, int] | str | None:
    """The learning queue's depth by state, ``unavailable: <Error>``, or ``None`` (no
    queue)."""
    if res.queue is None:
        return None
    try:
        async with asyncio.timeout(READY_TIMEOUT_SECONDS):
            depth = await res.queue.depth()
    except Exception as exc:  # reported, not raised
        return f"unavailable: {type(exc).__name__}"
    return {"ready": depth.ready, "delayed": depth.delayed, "leased": depth.leased,
            "dead": depth.dead, "buffered_messages": depth.buffered_messages}


def _learning(res: Resources) -> str:
    """``off``; ``on``; or ``stopped`` when this process runs the learning worker and its
    task has ended (it only ends on shutdown, so jobs would wait until a restart)."""
    if not res.learning_enabled:
        return "off"
    task = res.worker_task
    return "stopped" if task is not None and task.done() else "on"


async def metrics(request: Request) -> Response:
    res: Resources = request.app.state.resources
    res.metrics.event_loop_tasks.set(len(asyncio.all_tasks()))
    if res.queue is not None:
        try:
            depth = await res.queue.depth()
        except Exception as exc:  # metrics must render even when the store is down
            log.warning("metrics_queue_depth_failed", error=str(exc))
        else:
            for state in ("ready", "delayed", "leased", "dead"):
                res.metrics.queue_depth.labels(state).set(getattr(depth, state))
        try:
            by_kind = await res.queue.depth_by_kind()
        except Exception as exc:  # likewise
            log.warning("metrics_queue_jobs_failed", error=str(exc))
        else:
            for (kind, state), count in by_kind.items():
                res.metrics.queue_jobs.labels(kind, state).set(count)
        try:
            age = await res.queue.oldest_ready_age()
        except Exception as exc:  # likewise
            log.warning("metrics_oldest_job_failed", error=str(exc))
        else:
            res.metrics.oldest_job_age.set(age or 0.0)
    res.metrics.spool_items.labels("learning_sink").set(res.sink.spool().pending_turns)
    res.metrics.spool_items.labels("usage").set(res.usage.pending)
    return Response(res.metrics.render(), media_type="text/plain; version=0.0.4")


openapi.register(
    openapi.Operation("GET", "/healthz", "Liveness", auth="none", response=Healthz,
                      tags=("health",)),
    openapi.Operation("GET", "/readyz", "Readiness of each dependency", auth="none",
                      response=Readyz, errors=(503,), tags=("health",)),
    openapi.Operation("GET", "/metrics", "Prometheus metrics", auth="none",
                      response_media="text/plain", tags=("health",)),
)
