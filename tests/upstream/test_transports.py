"""The two upstream transports (the aiohttp relay, litellm) behave alike where the client
can tell: the body's fields reach the upstream, and an unreachable upstream is the same
502 ``upstream_unavailable``."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import UpstreamUnavailableError
from proxy.models import ModelRegistry
from proxy.upstream.base import UpstreamCall
from proxy.upstream.litellm_adapter import LiteLLMUpstream
from proxy.upstream.relay import RelayUpstream
from tests.fakes import FakeUpstream, Gateway, make_settings

MESSAGES = [{"role": "user", "content": "hi"}]
TRANSPORTS = pytest.mark.parametrize("transport", ["auto", "litellm"], ids=["relay", "litellm"])


def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    sock.close()  # nothing listens there
    return port


async def test_the_body_user_reaches_the_upstream(any_gateway: Gateway,
                                                   upstream: FakeUpstream) -> None:
    """The OpenAI ``user`` field of the body is forwarded on every transport."""
    async with any_gateway.client() as client:
        response = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": MESSAGES, "user": "bob"})
    assert response.status_code == 200
    assert upstream.last_chat["user"] == "bob"


@TRANSPORTS
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_unreachable_upstream_is_the_same_502_on_both_transports(
    tmp_path: Path, transport: str, stream: bool
) -> None:
    """A closed port on 127.0.0.1 is 502 ``upstream_unavailable`` with the same code and
    message shape ("Could not reach the upstream (<when>: <exception class>).") on both
    transports, and the message names neither the host nor the port."""
    port = _closed_port()
    settings = make_settings(tmp_path, upstream={"transport": transport}, model_list=[{
        "model_name": "m", "litellm_params": {
            "model": "openai/up-model", "api_base": f"http://127.0.0.1:{port}/v1",
            "api_key": "sk-upstream"}}])
    route = ModelRegistry(settings).route("m")
    upstream: Any = RelayUpstream(settings.upstream) if transport == "auto" \
        else LiteLLMUpstream(settings.upstream)
    body: dict[str, Any] = {"messages": MESSAGES, **({"stream": True} if stream else {})}
    try:
        call = upstream.stream if stream else upstream.complete
        with pytest.raises(UpstreamUnavailableError) as caught:
            await call(UpstreamCall(route, body))
    finally:
        await upstream.aclose()
    error = caught.value.to_dict()["error"]
    assert caught.value.status_code == 502
    assert error["type"] == "upstream_unavailable"
    assert error["code"] is None
    when = "before the first byte" if stream else "before the reply"
    assert re.fullmatch(rf"Could not reach the upstream \({when}: \w+\)\.", error["message"])
    assert "127.0.0.1" not in error["message"]
    assert str(port) not in error["message"]
