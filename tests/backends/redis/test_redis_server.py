"""The test Redis helper: it starts a usable server, and says why when it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests import redis_server
from tests.redis_server import RedisServer, RedisServerError

pytestmark = pytest.mark.redis


def test_server_starts_with_the_search_module() -> None:
    """The wheels' redis-server comes up with RediSearch loaded and goes away on stop."""
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        try:
            modules = {m[b"name"] for m in client.module_list()}
            assert b"search" in modules
        finally:
            client.close()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(server.url, socket_connect_timeout=1).ping()


def test_a_server_that_cannot_start_reports_why(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """A server that exits at once raises RedisServerError quoting its own output."""
    server, _ = redis_server.find_binaries()
    missing = tmp_path / "no-such-module.so"
    monkeypatch.setattr(redis_server, "find_binaries", lambda: (server, [missing]))
    with pytest.raises(RedisServerError, match="no-such-module"):
        RedisServer().start()
