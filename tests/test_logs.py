"""Logs: throttling for warnings that can fire on every request; a log stream that fails."""

from __future__ import annotations

import io
import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from proxy.access import AccessLogMiddleware
from proxy.logs import LogThrottle, configure_logging
from proxy.settings import ServerSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_interval_per_key_with_the_count_held_back() -> None:
    clock = Clock()
    throttle = LogThrottle(10.0, clock=clock)
    assert throttle.allow("timeout") == 0  # the first occurrence is always logged
    assert [throttle.allow("timeout") for _ in range(5)] == [None] * 5
    assert throttle.allow("unavailable") == 0  # keys are independent
    clock.now += 9.9
    assert throttle.allow("timeout") is None
    clock.now += 0.1
    assert throttle.allow("timeout") == 6  # says how many lines were held back
    assert throttle.allow("timeout") is None
    clock.now += 60
    assert throttle.allow("timeout") == 1
    assert throttle.allow("unavailable") == 0


@pytest.mark.parametrize("broken", [False, True], ids=["open", "closed"])
async def test_a_log_stream_that_cannot_be_written_never_fails_a_request(broken: bool) -> None:
    """The JSON log's reader can go away (a closed pipe, a full disk): the request still
    completes and nothing escapes the app — an exception after the response would make the
    server drop the connection under the client's next request — and the line is dropped;
    with the stream open, each request writes its line."""
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hi")

    app = AccessLogMiddleware(Starlette(routes=[Route("/hello", hello)]),
                              settings=ServerSettings())
    stream = io.StringIO()
    configure_logging(fmt="json", stream=stream)
    if broken:
        stream.close()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gateway") as client:
        responses = [await client.get("/hello") for _ in range(2)]
    assert [(r.status_code, r.text) for r in responses] == [(200, "hi")] * 2
    if not broken:
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert [(line["event"], line["route"], line["status"]) for line in lines] == [
            ("http_request", "/hello", 200)] * 2
