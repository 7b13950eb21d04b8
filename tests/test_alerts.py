"""The alerts webhook (proxy/alerts.py) against a local HTTP receiver.

Rounds are driven with explicit times (``Monitor.check(now)``): no test waits for a clock.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.alerts import SIGNATURE_HEADER, TIMESTAMP_HEADER, Check, Monitor, standard_checks
from proxy.metrics import Metrics
from proxy.settings import AlertSettings, load_settings
from tests.fakes import FakeUpstream, Reply, eventually, make_settings, running_gateway


class Receiver:
    """Collects webhook posts; answers ``statuses`` in turn, then 200."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.url = ""

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [orjson.loads(body) for _, body in self.posts]

    async def handle(self, request: web.Request) -> web.Response:
        self.posts.append((dict(request.headers), await request.read()))
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/hook", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    rec.url = f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    try:
        yield rec
    finally:
        await runner.cleanup()


class Switch:
    """A probe whose condition the test turns on and off."""

    def __init__(self) -> None:
        self.on = False

    async def __call__(self) -> tuple[bool, dict[str, Any]]:
        return self.on, {"on": self.on}


def monitor(receiver: Receiver, checks: list[Check], **settings: Any) -> Monitor:
    values: dict[str, Any] = {"webhook_url": receiver.url, "for_seconds": 60,
                              "repeat_seconds": 600, **settings}
    return Monitor(AlertSettings(**values), checks, metrics=Metrics(), instance="test:1")


async def test_a_blip_shorter_than_for_seconds_is_not_reported(receiver: Receiver) -> None:
    """A condition that clears before for_seconds sends nothing, not even a resolve."""
    switch = Switch()
    mon = monitor(receiver, [Check("store_unreachable", "critical", "down", switch)])
    try:
        switch.on = True
        await mon.check(1000)
        await mon.check(1059)
        switch.on = False
        await mon.check(1070)
    finally:
        await mon.aclose()
    assert receiver.posts == []


async def test_a_lasting_condition_fires_repeats_throttled_then_resolves(
    receiver: Receiver,
) -> None:
    """Firing after for_seconds, at most one repeat per repeat_seconds while it holds, one
    resolved message when it clears, each with the documented fields."""
    switch = Switch()
    mon = monitor(receiver, [Check("upstream_failing", "critical", "upstream down", switch)])
    try:
        switch.on = True
        for now in (1000, 1030, 1060, 1100, 1500, 1660, 1700, 2300):
            await mon.check(now)
        switch.on = False
        await mon.check(2310)
        await mon.check(2320)
    finally:
        await mon.aclose()
    bodies = receiver.bodies
    assert [(b["state"], b["repeat"], b["at"]) for b in bodies] == [
        ("firing", 0, "1970-01-01T00:17:40Z"),  # 1060: held for for_seconds (60 s)
        ("firing", 1, "1970-01-01T00:27:40Z"),  # 1660: repeat_seconds after the last send
        ("firing", 2, "1970-01-01T00:38:20Z"),  # 2300: the first round past 2260
        ("resolved", 2, "1970-01-01T00:38:30Z"),  # 2310: cleared; 2320 sends nothing
    ]
    first = bodies[0]
    assert first["alert"] == "upstream_failing"
    assert first["severity"] == "critical"
    assert first["since"] == "1970-01-01T00:16:40Z"
    assert first["instance"] == "test:1"
    assert first["details"] == {"on": True}
    assert bodies[-1]["details"] == {"on": False}
    assert all(h["Content-Type"] == "application/json" for h, _ in receiver.posts)
    assert all(SIGNATURE_HEADER not in h for h, _ in receiver.posts)  # no secret, no signature


async def test_bodies_are_signed_with_hmac_sha256_over_timestamp_and_body(
    receiver: Receiver,
) -> None:
    """With alerts.secret set, the signature header is HMAC-SHA256 over '<timestamp>.' +
    the raw body, and a receiver holding another secret cannot verify it."""
    switch = Switch()
    switch.on = True
    mon = monitor(receiver, [Check("learning_failing", "warning", "x", switch)],
                  secret="s3cret", for_seconds=0)
    try:
        await mon.check(5000)
    finally:
        await mon.aclose()
    (headers, body), = receiver.posts
    timestamp = headers[TIMESTAMP_HEADER]
    assert timestamp == "5000"
    expected = hmac.new(b"s3cret", timestamp.encode() + b"." + body, hashlib.sha256)
    assert headers[SIGNATURE_HEADER] == "sha256=" + expected.hexdigest()
    forged = hmac.new(b"other", timestamp.encode() + b"." + body, hashlib.sha256)
    assert headers[SIGNATURE_HEADER] != "sha256=" + forged.hexdigest()


async def test_a_failed_delivery_is_retried_at_the_next_round(receiver: Receiver) -> None:
    """A receiver answering 500 does not swallow the alert: the next round sends it again,
    and the failure is counted."""
    switch = Switch()
    switch.on = True
    receiver.statuses = [500]
    mon = monitor(receiver, [Check("store_unreachable", "critical", "x", switch)],
                  for_seconds=0)
    metrics = mon._metrics
    assert metrics is not None
    try:
        await mon.check(100)
        await mon.check(115)
        await mon.check(130)  # firing was delivered at 115: no repeat before 600 s
    finally:
        await mon.aclose()
    assert [b["state"] for b in receiver.bodies] == ["firing", "firing"]
    assert metrics.registry.get_sample_value(
        "memory_proxy_alerts_total",
        {"alert": "store_unreachable", "state": "firing", "outcome": "failed"}) == 1
    assert metrics.registry.get_sample_value(
        "memory_proxy_alerts_total",
        {"alert": "store_unreachable", "state": "firing", "outcome": "sent"}) == 1


async def test_standard_checks_read_the_gateway_metrics_and_the_store(
    receiver: Receiver,
) -> None:
    """upstream_failing fires on rounds where most chat requests failed upstream (not when
    most succeeded), store_unreachable when ping raises, learning_failing when jobs fail
    and none succeed, dead_letters_growing when the list outgrows its starting size."""
    metrics = Metrics()
    store_down = [False]
    dead = [2]

    async def ping() -> None:
        if store_down[0]:
            raise ConnectionError("refused")

    async def dead_letters() -> int:
        return dead[0]

    checks = standard_checks(metrics=metrics, ping=ping, dead_letters=dead_letters,
                             gateway=True, learning=True, upstream_failure_ratio=0.5)
    mon = Monitor(AlertSettings(webhook_url=receiver.url, for_seconds=0), checks,
                  metrics=metrics)
    try:
        await mon.check(0)  # dead-letter baseline: 2
        metrics.requests.labels("m", "false", "upstream_error").inc()
        metrics.http_requests.labels("/v1/chat/completions", "POST", "500").inc(9)  # not read
        for _ in range(5):
            metrics.requests.labels("m", "false", "ok").inc()
        await mon.check(10)  # 1 failure in 6 requests: below the ratio
        assert receiver.posts == []
        metrics.requests.labels("m", "true", "upstream_error").inc(3)
        metrics.requests.labels("m", "true", "error").inc()
        metrics.requests.labels("m", "false", "ok").inc()
        metrics.learning_events.labels(event="job_retried", label="learn").inc()
        store_down[0] = True
        dead[0] = 3
        await mon.check(20)
        fired = {b["alert"]: b for b in receiver.bodies}
        assert set(fired) == {"upstream_failing", "store_unreachable", "learning_failing",
                              "dead_letters_growing"}
        assert fired["upstream_failing"]["details"] == {"failed": 4, "succeeded": 1}
        assert "ConnectionError" in fired["store_unreachable"]["details"]["error"]
        metrics.requests.labels("m", "false", "ok").inc()
        metrics.learning_events.labels(event="job_done", label="learn").inc()
        store_down[0] = False
        dead[0] = 2
        await mon.check(30)
    finally:
        await mon.aclose()
    resolved = {b["alert"] for b in receiver.bodies if b["state"] == "resolved"}
    assert resolved == {"upstream_failing", "store_unreachable", "learning_failing",
                        "dead_letters_growing"}


def test_webhook_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """alerts.webhook_url and alerts.secret accept os.environ/NAME (unset: alerts off) and
    refuse a URL that is not http(s)."""
    monkeypatch.setenv("HOOK", "https://hooks.example.com/x")
    settings = load_settings(use_file=False, alerts={"webhook_url": "os.environ/HOOK",
                                                     "secret": "os.environ/NOPE"})
    assert settings.alerts.webhook_url is not None
    assert settings.alerts.webhook_url.get_secret_value() == "https://hooks.example.com/x"
    assert settings.alerts.secret is None
    off = load_settings(use_file=False, alerts={"webhook_url": "os.environ/UNSET_HOOK"})
    assert off.alerts.webhook_url is None
    from proxy.settings import ConfigError

    with pytest.raises(ConfigError, match=r"alerts\.webhook_url"):
        load_settings(use_file=False, alerts={"webhook_url": "ftp://x"})


async def test_a_served_gateway_reports_a_failing_upstream_and_its_recovery(
    receiver: Receiver, tmp_path: Path,
) -> None:
    """End to end: with alerts.webhook_url set, the gateway's own monitor posts
    upstream_failing while the upstream answers 500s, and resolved once it answers again."""
    upstream = FakeUpstream()
    upstream.push(*(Reply(status=500, json={"error": {"message": "boom"}}) for _ in range(3)))
    settings = make_settings(tmp_path, alerts={
        "webhook_url": receiver.url, "for_seconds": 0, "check_interval_seconds": 0.05})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with running_gateway(settings, upstream) as gateway, gateway.client() as client:
        assert (await client.post("/v1/chat/completions", json=body)).status_code >= 500

        async def fired() -> bool:
            return any(b["alert"] == "upstream_failing" for b in receiver.bodies)

        await eventually(fired)
        while upstream.script:  # the remaining scripted failures are not needed
            upstream.script.popleft()
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200

        async def resolved() -> bool:
            return any(b["state"] == "resolved" for b in receiver.bodies)

        await eventually(resolved)
    states = [(b["alert"], b["state"]) for b in receiver.bodies]
    assert states[:1] == [("upstream_failing", "firing")]
    assert ("upstream_failing", "resolved") in states
