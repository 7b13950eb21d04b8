"""Liveness, readiness and metrics.

``/healthz`` answers 200 while the process runs. ``/readyz`` reports each dependency; it
answers 200 whenever chat can be served — a memory store outage degrades memory, not chat
(SPEC §8), so it shows as ``"degraded"`` with 200 — and 503 only when no model is
configured. ``checks.learning`` is ``off``, ``on``, or ``stopped`` when the learning worker
this process runs has ended (also ``"degraded"``: chat goes on, learning does not).
"""

from __future__ import annotations

import asyncio

import structlog
from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.resources import Resources
from proxy.routes.json import json_response
from proxy.routes.shapes import Healthz, Readyz

log = structlog.get_logger("proxy.health")
READY_TIMEOUT_SECONDS = 2.0


async def healthz(_request: Request) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request) -> Response:
    res: Resources = request.app.state.resources
    checks: dict[str, object] = {}
    try:
        async with asyncio.timeout(READY_TIMEOUT_SECONDS):
            await res.store.ping()
        checks["store"] = "ok"
    except Exception as exc:  # any failure is reported, none is raised
        checks["store"] = f"unavailable: {type(exc).__name__}"
    if res.queue is not None:
        try:
            async with asyncio.timeout(READY_TIMEOUT_SECONDS):
                depth = await res.queue.depth()
            checks["learning_queue"] = {
                "ready": depth.ready, "delayed": depth.delayed, "leased": depth.leased,
                "dead": depth.dead, "buffered_messages": depth.buffered_messages,
            }
        except Exception as exc:  # reported, not raised
            checks["learning_queue"] = f"unavailable: {type(exc).__name__}"
    checks["models"] = len(res.registry.names)
    checks["embedder"] = res.embedder.model if res.embedder is not None else "none"
    checks["learning"] = _learning(res)
    if not res.registry.names:
        return json_response({"status": "unavailable", "checks": checks}, status_code=503)
    degraded = checks["store"] != "ok" or isinstance(checks.get("learning_queue"), str) \
        or checks["learning"] == "stopped"
    return json_response({"status": "degraded" if degraded else "ok", "checks": checks})


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
    return Response(res.metrics.render(), media_type="text/plain; version=0.0.4")


openapi.register(
    openapi.Operation("GET", "/healthz", "Liveness", auth="none", response=Healthz,
                      tags=("health",)),
    openapi.Operation("GET", "/readyz", "Readiness of each dependency", auth="none",
                      response=Readyz, errors=(503,), tags=("health",)),
    openapi.Operation("GET", "/metrics", "Prometheus metrics", auth="none",
                      response_media="text/plain", tags=("health",)),
)
