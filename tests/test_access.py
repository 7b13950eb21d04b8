"""The access log line and the per-route HTTP metrics (proxy/access.py), on a served
gateway."""

from __future__ import annotations

import hashlib
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from proxy.access import user_field
from tests.fakes import Gateway, Reply, text_chunks

SECRET_TEXT = "my bank PIN is 4821"


def access_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e.get("event") == "http_request"]


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def test_one_line_per_chat_request_with_ids_and_timings_but_no_text(
    gateway: Gateway,
) -> None:
    """A chat request logs one http_request line: request id (also in the x-request-id
    header), route, status, tenant, the user's hash, model, memory status, injected count,
    TTFT and duration — and never the messages or the user id."""
    async with gateway.client() as client:
        with capture_logs() as logs:
            response = await client.post("/v1/chat/completions", headers={
                "X-User-Id": "alice@example.com"}, json={
                "model": "m", "messages": [{"role": "user", "content": SECRET_TEXT}]})
    assert response.status_code == 200
    line, = access_lines(logs)
    assert line["request_id"] == response.headers["x-request-id"]
    assert len(line["request_id"]) == 32
    assert (line["route"], line["method"], line["status"]) == (
        "/v1/chat/completions", "POST", 200)
    assert line["tenant"] == "default"
    assert line["user"] == hashlib.sha256(b"default\x1falice@example.com").hexdigest()[:16]
    assert (line["model"], line["stream"]) == ("m", False)
    assert line["memory"] in {"empty", "injected"}
    assert line["injected"] == 0
    assert 0 < line["ttft_ms"] <= line["duration_ms"]
    flat = repr(line)
    assert SECRET_TEXT not in flat
    assert "alice" not in flat


async def test_a_stream_logs_its_outcome_when_it_ends(gateway: Gateway) -> None:
    """For a stream the line is written after the last byte: its duration covers the
    whole stream (events 50 ms apart), beyond the TTFT, with outcome ok."""
    gateway.upstream.push(Reply(events=text_chunks("one two three", pieces=3), gap=0.05))
    async with gateway.client() as client:
        with capture_logs() as logs:
            async with client.stream("POST", "/v1/chat/completions", json={
                    "model": "m", "stream": True,
                    "messages": [{"role": "user", "content": "hi"}]}) as response:
                body = b"".join([part async for part in response.aiter_bytes()])
    assert body.endswith(b"data: [DONE]\n\n")
    line, = access_lines(logs)
    assert (line["stream"], line["outcome"], line["memory"]) == (True, "ok", "no_user")
    assert line["duration_ms"] >= 4 * 50  # the last event left the upstream ≥ 200 ms in
    assert line["ttft_ms"] < line["duration_ms"]
    assert "user" not in line


async def test_a_client_request_id_is_kept_and_a_malformed_one_replaced(
    gateway: Gateway,
) -> None:
    """A plausible X-Request-Id is the request's id; one with spaces or too long is not."""
    async with gateway.client() as client:
        with capture_logs() as logs:
            kept = await client.get("/v1/models", headers={"X-Request-Id": "req-42.a:b"})
            replaced = await client.get("/v1/models", headers={"X-Request-Id": "bad id"})
            long = await client.get("/v1/models", headers={"X-Request-Id": "x" * 129})
    assert kept.headers["x-request-id"] == "req-42.a:b"
    assert replaced.headers["x-request-id"] != "bad id"
    assert len(long.headers["x-request-id"]) == 32
    assert [line["request_id"] for line in access_lines(logs)] == [
        "req-42.a:b", replaced.headers["x-request-id"], long.headers["x-request-id"]]


async def test_http_metrics_count_routes_by_template_method_and_status(
    gateway: Gateway,
) -> None:
    """memory_proxy_http_requests_total uses route templates (one series for every
    memory id), 'unmatched' for unknown paths, and the final status; the scrape also
    shows the oldest-job age and spool gauges."""
    async with gateway.client() as client:
        await client.get("/v1/memories/mem_1", headers={"X-User-Id": "u"})
        await client.get("/v1/memories/mem_2", headers={"X-User-Id": "u"})
        await client.get("/nope")
        await client.get("/healthz")
        text = (await client.get("/metrics")).text
    http = samples(text, "memory_proxy_http_requests_total")
    route = (("method", "GET"), ("route", "/v1/memories/{memory_id}"), ("status", "404"))
    assert http[route] == 2
    assert http[(("method", "GET"), ("route", "unmatched"), ("status", "404"))] == 1
    assert http[(("method", "GET"), ("route", "/healthz"), ("status", "200"))] == 1
    assert samples(text, "memory_proxy_spool_items")[(("spool", "usage"),)] >= 0
    assert "memory_proxy_http_request_seconds_bucket" in text


def test_user_field_modes() -> None:
    """hash (16 hex digits, per tenant), plain, off; no user → no field."""
    hashed = user_field("t1", "bob", "hash")
    assert hashed is not None
    assert len(hashed) == 16
    assert hashed != user_field("t2", "bob", "hash")
    assert user_field("t1", "bob", "plain") == "bob"
    assert user_field("t1", "bob", "off") is None
    assert user_field("t1", None, "hash") is None
