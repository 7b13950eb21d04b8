"""Alerts webhook: conditions that last are reported, repeats throttled, recovery reported.

Brief blips are not reported, repeats are throttled, recovery is reported too
(docs/design.md#alerts). A
:class:`Monitor` evaluates its :class:`Check` s every ``alerts.check_interval_seconds``
(:meth:`Monitor.run`; :meth:`Monitor.check` does one round at a given time, for tests).
Each check is a state machine:

- the condition holds → *pending*; once it has held for ``alerts.for_seconds`` without a
  break → ``firing`` is sent;
- still holding → ``firing`` is sent again (``repeat`` counts up) at most every
  ``alerts.repeat_seconds``;
- it clears → ``resolved`` is sent once (after a firing; a pending blip is forgotten).

A delivery that fails (connection error, timeout, non-2xx) is logged, counted
(``memory_proxy_alerts_total{outcome="failed"}``) and tried again at the next round.

The checks (:func:`standard_checks`), each run where its data lives:

- ``store_unreachable`` (critical) — the memory store's ``ping`` fails or times out (a
  ping that found no free pool connection in time is not an outage: it counts below);
- ``store_pool_exhausted`` (warning) — in one round, storage commands found no free
  connection within the pool's bounded wait
  (``memory_proxy_store_pool_exhausted_total`` grew): memory was skipped for lack of a
  connection, not for an outage — raise ``storage.redis_max_connections`` or look at
  what keeps Redis busy;
- ``upstream_failing`` (critical, gateways) — in one round, at least one chat request and
  at least ``alerts.upstream_failure_ratio`` of them failed upstream
  (``memory_proxy_requests_total{status="upstream_error"}``: the upstream answered an
  error, timed out or was unreachable; or a stream that ended in an error event);
- ``learning_failing`` (warning, processes running a learning worker) — in one round,
  learning jobs failed (retried or dead-lettered) and none succeeded;
- ``dead_letters_growing`` (warning, idem) — the dead-letter list is longer than when the
  process started (clears when requeued or emptied back to that size).

**Webhook body** (JSON, UTF-8)::

    {"alert": "upstream_failing", "state": "firing" | "resolved", "severity": "critical",
     "summary": "...", "details": {...}, "since": "<ISO 8601 UTC>", "at": "<ISO 8601 UTC>",
     "repeat": 0, "instance": "<hostname>:<pid>", "service": "memory-proxy"}

**Signature** (when ``alerts.secret`` is set): header ``X-Memory-Proxy-Timestamp`` (epoch
seconds) and ``X-Memory-Proxy-Signature: sha256=<hex>``, the HMAC-SHA256 with the secret
over ``<timestamp>.`` followed by the raw body bytes (the scheme Stripe and Slack use: the
receiver recomputes it, compares in constant time, and rejects stale timestamps).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import aiohttp
import orjson
import structlog

from proxy.memory.store import StoreBusyError
from proxy.metrics import Metrics
from proxy.resources import Resources
from proxy.settings import AlertSettings

log = structlog.get_logger("proxy.alerts")
SIGNATURE_HEADER = "X-Memory-Proxy-Signature"
TIMESTAMP_HEADER = "X-Memory-Proxy-Timestamp"
PING_TIMEOUT_SECONDS = 5.0

# A probe answers whether its condition holds now, with details for the message.
Probe = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]


@dataclass
class Check:
    """One alert: ``name`` (the webhook's ``alert``), ``severity``, a one-line
    ``summary`` and the ``probe`` evaluating it."""

    name: str
    severity: Literal["critical", "warning"]
    summary: str
    probe: Probe
    pending_since: float | None = field(default=None, init=False)
    firing: bool = field(default=False, init=False)
    last_sent: float = field(default=0.0, init=False)
    repeats: int = field(default=0, init=False)


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 with ``secret`` over ``<timestamp>.<body>``."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body,
                                hashlib.sha256).hexdigest()


class Monitor:
    """Runs ``checks`` and posts their transitions to ``settings.webhook_url`` (which must be
    set). ``session``: an aiohttp session to use (closed by its owner); otherwise one is
    opened by :meth:`run` / :meth:`aclose`."""

    def __init__(self, settings: AlertSettings, checks: list[Check], *,
                 metrics: Metrics | None = None,
                 session: aiohttp.ClientSession | None = None,
                 instance: str | None = None) -> None:
        if settings.webhook_url is None:
            raise ValueError("alerts.webhook_url is not set")
        self._settings = settings
        self._url = settings.webhook_url.get_secret_value()
        self._secret = settings.secret.get_secret_value().encode() if settings.secret else None
        self.checks = checks
        self._metrics = metrics
        self._session = session
        self._own_session = session is None
        self._instance = instance or f"{socket.gethostname()}:{os.getpid()}"

    async def run(self) -> None:
        """Check every ``check_interval_seconds`` until cancelled."""
        log.info("alerts_started", checks=[c.name for c in self.checks])
        try:
            while True:
                await asyncio.sleep(self._settings.check_interval_seconds)
                await self.check(time.time())
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def check(self, now: float) -> None:
        """One round at ``now`` (epoch seconds): probe every check, send what is due."""
        for check in self.checks:
            try:
                active, details = await check.probe()
            except Exception as exc:  # a probe that fails is itself a finding
                log.warning("alert_probe_failed", alert=check.name, error=repr(exc))
                continue
            await self._step(check, active, details, now)

    async def _step(self, check: Check, active: bool, details: dict[str, Any],
                    now: float) -> None:
        s = self._settings
        if not active:
            check.pending_since = None
            if check.firing and await self._send(check, "resolved", details, now):
                check.firing, check.repeats = False, 0
            return
        if check.pending_since is None:
            check.pending_since = now
        if not check.firing:
            if now - check.pending_since >= s.for_seconds and \
                    await self._send(check, "firing", details, now):
                check.firing, check.last_sent = True, now
        elif now - check.last_sent >= s.repeat_seconds:
            check.repeats += 1
            if await self._send(check, "firing", details, now):
                check.last_sent = now
            else:
                check.repeats -= 1

    async def _send(self, check: Check, state: str, details: dict[str, Any],
                    now: float) -> bool:
        since = check.pending_since if check.pending_since is not None else now
        body = orjson.dumps({
            "alert": check.name, "state": state, "severity": check.severity,
            "summary": check.summary, "details": details,
            "since": _iso(since), "at": _iso(now), "repeat": check.repeats,
            "instance": self._instance, "service": "memory-proxy",
        })
        headers = {"Content-Type": "application/json"}
        if self._secret is not None:
            timestamp = str(int(now))
            headers[TIMESTAMP_HEADER] = timestamp
            headers[SIGNATURE_HEADER] = sign(self._secret, timestamp, body)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            async with self._session.post(
                    self._url, data=body, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=self._settings.timeout_seconds)) as r:
                ok = 200 <= r.status < 300
                detail = f"HTTP {r.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            ok, detail = False, repr(exc)
        if self._metrics is not None:
            self._metrics.alerts.labels(check.name, state, "sent" if ok else "failed").inc()
        if ok:
            log.warning("alert_sent", alert=check.name, state=state, repeat=check.repeats)
        else:
            log.error("alert_delivery_failed", alert=check.name, state=state, error=detail)
        return ok


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _sum(metrics: Metrics, name: str, match: Callable[[dict[str, str]], bool]) -> float:
    """Sum of the ``name`` samples of ``metrics`` whose labels satisfy ``match``."""
    total = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and match(sample.labels):
                total += sample.value
    return total


class _Delta:
    """The growth of a counter sum between two calls."""

    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read
        self._last = read()

    def __call__(self) -> float:
        value = self._read()
        grown, self._last = value - self._last, value
        return grown


def standard_checks(*, metrics: Metrics, ping: Callable[[], Awaitable[None]],
                    dead_letters: Callable[[], Awaitable[int]] | None,
                    gateway: bool, learning: bool,
                    upstream_failure_ratio: float) -> list[Check]:
    """The checks of the module docstring. ``ping`` probes the store; ``dead_letters``
    counts the dead-letter list (``None``: no queue); ``gateway``: this process serves
    chat; ``learning``: it runs a learning worker."""

    async def store() -> tuple[bool, dict[str, Any]]:
        try:
            async with asyncio.timeout(PING_TIMEOUT_SECONDS):
                await ping()
        except StoreBusyError as exc:  # reachable, only busy: store_pool_exhausted
            return False, {"busy": str(exc)[:300]}
        except Exception as exc:  # any other failure means unreachable
            return True, {"error": f"{type(exc).__name__}: {exc}"[:300]}
        return False, {}

    exhausted = _Delta(lambda: _sum(metrics, "memory_proxy_store_pool_exhausted_total",
                                    lambda _: True))

    async def pool() -> tuple[bool, dict[str, Any]]:
        waits = exhausted()
        return waits > 0, {"exhausted": int(waits)}

    checks = [Check("store_unreachable", "critical",
                    "The memory store does not answer: memory is degraded (chat goes on).",
                    store),
              Check("store_pool_exhausted", "warning",
                    "Storage commands found no free connection in time: memory was skipped "
                    "for lack of a connection (raise storage.redis_max_connections).",
                    pool)]
    if gateway:
        failed = _Delta(lambda: _sum(
            metrics, "memory_proxy_requests_total",
            lambda lb: lb["status"] == "upstream_error"
            or (lb["stream"] == "true" and lb["status"] == "error")))
        served = _Delta(lambda: _sum(metrics, "memory_proxy_requests_total",
                                     lambda lb: lb["status"] == "ok"))

        async def upstream() -> tuple[bool, dict[str, Any]]:
            bad, good = failed(), served()
            total = bad + good
            active = bad > 0 and bad / total >= upstream_failure_ratio
            return active, {"failed": int(bad), "succeeded": int(good)}

        checks.append(Check("upstream_failing", "critical",
                            "Chat requests are failing at the upstream model.", upstream))
    if learning:
        job_failed = _Delta(lambda: _sum(
            metrics, "memory_proxy_learning_events_total",
            lambda lb: lb["event"] in ("job_retried", "job_dead")))
        job_done = _Delta(lambda: _sum(metrics, "memory_proxy_learning_events_total",
                                       lambda lb: lb["event"] == "job_done"))

        async def learning_jobs() -> tuple[bool, dict[str, Any]]:
            bad, good = job_failed(), job_done()
            return bad > 0 and good == 0, {"failed": int(bad), "succeeded": int(good)}

        checks.append(Check("learning_failing", "warning",
                            "Learning jobs keep failing (retried or dead-lettered); memory "
                            "is not being learned.", learning_jobs))
        if dead_letters is not None:
            count = dead_letters
            baseline: list[int] = []

            async def dead() -> tuple[bool, dict[str, Any]]:
                now = await count()
                if not baseline:
                    baseline.append(now)
                return now > baseline[0], {"dead_letters": now, "baseline": baseline[0]}

            checks.append(Check("dead_letters_growing", "warning",
                                "Learning jobs are being dead-lettered; see GET "
                                "/v1/admin/dead-letters.", dead))
    return checks


def alert_monitor(res: Resources, *, gateway: bool) -> Monitor | None:
    """The alerts webhook's monitor for this process (``None`` when
    ``alerts.webhook_url`` is unset): store and, for a gateway, upstream checks; learning
    checks where a learning worker runs (proxy/alerts.py)."""
    alerts = res.settings.alerts
    if alerts.webhook_url is None:
        return None
    queue = res.queue
    learning = res.worker is not None and (res.settings.server.run_worker or not gateway)

    async def dead_letters() -> int:
        assert queue is not None
        return (await queue.depth()).dead

    return Monitor(alerts, standard_checks(
        metrics=res.metrics, ping=res.store.ping,
        dead_letters=dead_letters if queue is not None else None, gateway=gateway,
        learning=learning, upstream_failure_ratio=alerts.upstream_failure_ratio,
    ), metrics=res.metrics)
