"""The command line as a newcomer runs it: a real ``memory-proxy serve`` process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_serve_starts_logs_json_and_answers(tmp_path: Path) -> None:
    """``memory-proxy serve`` starts with a config file, logs JSON lines, serves /healthz,
    /readyz and /v1/models, and stops cleanly on SIGTERM."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: local\n"
        "    litellm_params: {model: openai/x, api_base: 'http://127.0.0.1:9/v1'}\n"
        f"storage: {{path: '{tmp_path / 'db.sqlite'}'}}\n"
        "learning: {enabled: true}\n"
    )
    port = _free_port()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)],
        stderr=subprocess.PIPE, env=env, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.1)
        assert httpx.get(base + "/readyz").json()["checks"]["learning"] == "on"
        assert [m["id"] for m in httpx.get(base + "/v1/models").json()["data"]] == ["local"]
        unreachable = httpx.post(base + "/v1/chat/completions", json={
            "model": "local", "messages": [{"role": "user", "content": "hi"}]})
        assert unreachable.status_code == 502
    finally:
        process.terminate()
        _, err = process.communicate(timeout=20)
    # uvicorn re-raises the signal after a graceful shutdown: exit status is -SIGTERM.
    assert process.returncode in (0, -15)
    events = [orjson.loads(line) for line in err.splitlines() if line.startswith("{")]
    names = [e.get("event") for e in events]
    assert {"auth_open_mode", "gateway_started", "gateway_stopped"} <= set(names)
    assert all("level" in e and "timestamp" in e for e in events)
    # One "listening" line once the app is up: where, how many processes, which storage.
    [listening] = [e for e in events if e.get("event") == "gateway_listening"]
    assert names.index("gateway_listening") > names.index("gateway_started")
    assert (listening["url"], listening["host"], listening["port"]) == (
        f"http://127.0.0.1:{port}", "127.0.0.1", port)
    assert (listening["processes"], listening["backend"], listening["worker"]) == (
        1, "sqlite", True)
    assert listening["level"] == "info"


def test_dead_letters_are_listed_and_requeued(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``memory-proxy dead-letters`` lists dead jobs and ``--requeue-all`` revives them."""
    import sqlite3

    from proxy.cli import main

    db = tmp_path / "db.sqlite"
    config = tmp_path / "c.yaml"
    config.write_text(f"storage: {{path: '{db}'}}\n")
    assert main(["dead-letters", "--config", str(config)]) == 0  # creates the schema
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO jobs (id, kind, payload, status, attempts, available_at, "
                     "last_error, created_at, updated_at) VALUES ('learn:b1', 'learn', x'7b7d', "
                     "'dead', 8, 0, 'UpstreamError: 500', 0, 0)")
    capsys.readouterr()
    assert main(["dead-letters", "--config", str(config)]) == 0
    listed = capsys.readouterr().out
    assert "learn:b1" in listed
    assert "UpstreamError: 500" in listed
    assert "tenant=-" in listed  # inserted without a tenant, like a pre-tenant job
    assert main(["dead-letters", "--config", str(config), "--requeue-all"]) == 0
    assert "requeued 1 job(s)" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT status, attempts FROM jobs").fetchone() == ("ready", 0)


def test_a_dead_job_is_dropped_from_the_cli(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``memory-proxy dead-letters --drop ID`` deletes a dead job of any tenant (legacy jobs
    without one included); an unknown id exits 1."""
    import sqlite3

    from proxy.cli import main

    db = tmp_path / "db.sqlite"
    config = tmp_path / "c.yaml"
    config.write_text(f"storage: {{path: '{db}'}}\n")
    assert main(["dead-letters", "--config", str(config)]) == 0  # creates the schema
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO jobs (id, kind, payload, status, attempts, available_at, "
                     "last_error, created_at, updated_at) VALUES ('learn:b1', 'learn', x'7b7d', "
                     "'dead', 8, 0, 'UpstreamError: 500', 0, 0)")
    capsys.readouterr()
    assert main(["dead-letters", "--config", str(config), "--drop", "learn:b1"]) == 0
    assert "dropped 1 job(s)" in capsys.readouterr().out
    assert main(["dead-letters", "--config", str(config), "--drop", "learn:b1"]) == 1
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_a_busy_port_is_reported_before_anything_starts(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """``serve`` on a port another process holds exits 2 at once with a message naming the
    setting — the gateway does not come up first and fail afterwards."""
    from proxy.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(f"storage: {{path: '{tmp_path / 'db.sqlite'}'}}\n")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        code = main(["serve", "--config", str(config), "--port", str(port)])
    assert code == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "server.port" in err
    assert "gateway_started" not in err


@pytest.mark.parametrize("port", ["99999", "-5"])
def test_an_impossible_port_on_the_command_line_names_the_setting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str) -> None:
    """``--port`` is validated like the config file and the environment are: exit 2 with a
    message naming ``server.port``, no traceback."""
    from proxy.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(f"storage: {{path: '{tmp_path / 'db.sqlite'}'}}\n")
    assert main(["serve", "--config", str(config), "--port", port]) == 2
    err = capsys.readouterr().err
    assert "server.port" in err
    assert "Traceback" not in err


def test_reindex_embeds_memories_stored_without_a_vector(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``memory-proxy reindex`` with the static embedder gives every stored memory a vector
    of that model (a second run has nothing to do); without an embedder it refuses."""
    import asyncio
    import sqlite3
    from datetime import UTC, datetime

    from proxy.backends.sqlite.database import SqliteDatabase
    from proxy.backends.sqlite.store import SqliteMemoryStore
    from proxy.cli import main
    from proxy.memory.records import Memory
    from tests.fakes import tiny_static_model

    db = tmp_path / "db.sqlite"
    model = tiny_static_model(tmp_path / "m2v-tiny")
    plain = tmp_path / "plain.yaml"
    plain.write_text(f"storage: {{path: '{db}'}}\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"storage: {{path: '{db}'}}\nmemory:\n  embedder:\n"
                      f"    provider: static\n    model: '{model}'\n"
                      f"    cache_dir: '{tmp_path / 'cache'}'\n")

    async def seed() -> None:
        now = datetime(2025, 1, 1, tzinfo=UTC)
        async with SqliteDatabase(db) as database:
            store = SqliteMemoryStore(database)
            for i, text in enumerate(("Owns a puppy called Rex", "Drinks chai")):
                await store.add(Memory(id=f"m{i}", tenant="t", user_id="u", content=text,
                                       created_at=now, updated_at=now, last_seen_at=now))

    asyncio.run(seed())
    assert main(["reindex", "--config", str(plain)]) == 2
    assert "memory.embedder.provider is none" in capsys.readouterr().err
    assert main(["reindex", "--config", str(config)]) == 0
    assert "static/m2v-tiny: 2 memories embedded" in capsys.readouterr().out
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT embedding_model, length(embedding) FROM memories").fetchall()
    assert rows == [("static/m2v-tiny", 8 * 4)] * 2
    assert main(["reindex", "--config", str(config)]) == 0
    assert "0 memories embedded" in capsys.readouterr().out
