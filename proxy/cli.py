"""``memory-proxy serve | worker`` — the command line.

``serve`` runs the gateway (and, in embedded mode, the learning worker in-process);
``worker`` runs only the learning worker against the configured storage, for running
learning in separate processes — next to ``serve`` on the SQLite file, or any number of
them on the Redis queue that ``serve --no-worker`` pods feed (``storage.backend: redis``);
``dead-letters`` lists learning jobs that failed for good (of every tenant, and those
dead-lettered before jobs carried a tenant, which no tenant's admin API lists), requeues
or drops them; ``reindex`` prepares the configured embedder (distils the ``static`` model
into ``memory.embedder.cache_dir`` when it is not there yet) and gives every active memory
a vector of it (:mod:`proxy.memory.reindex`), then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from proxy.errors import error_path
from proxy.settings import ConfigError, Settings, load_settings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memory-proxy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the OpenAI-compatible gateway")
    serve.add_argument("--config", help="YAML file (default: $MEMORY_PROXY_CONFIG or "
                                        "./config.yaml)")
    serve.add_argument("--host", help="bind address (server.host)")
    serve.add_argument("--port", type=int, help="port (server.port)")
    serve.add_argument("--no-worker", action="store_true",
                       help="do not run the learning worker in this process")
    serve.add_argument("--processes", type=int, metavar="N",
                       help="gateway processes sharing the port (server.processes); the "
                            "learning worker runs in the first one only")
    worker = sub.add_parser("worker", help="run the learning worker only")
    worker.add_argument("--config", help="YAML file")
    worker.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve this worker's Prometheus metrics on PORT (/metrics)")
    dead = sub.add_parser("dead-letters",
                          help="list learning jobs that failed for good, or requeue them")
    dead.add_argument("--config", help="YAML file")
    group = dead.add_mutually_exclusive_group()
    group.add_argument("--requeue", metavar="JOB_ID", help="requeue one job")
    group.add_argument("--requeue-all", action="store_true", help="requeue every dead job")
    group.add_argument("--drop", metavar="JOB_ID", help="delete one dead job for good")
    reindex = sub.add_parser(
        "reindex", help="distil the static embedding model if needed and embed every "
                        "memory that lacks a vector of the configured embedder")
    reindex.add_argument("--config", help="YAML file")
    return parser


def _load(args: argparse.Namespace) -> Settings:
    """The settings with the command line's ``--host`` / ``--port`` / ``--no-worker`` on top,
    validated like the file and the environment are. Raises :class:`ConfigError`."""
    settings = load_settings(args.config)
    overrides = {
        k: v for k, v in {
            "host": getattr(args, "host", None), "port": getattr(args, "port", None),
            "run_worker": False if getattr(args, "no_worker", False) else None,
            "processes": getattr(args, "processes", None),
        }.items() if v is not None
    }
    data = {**settings.server.model_dump(), **overrides}
    try:
        server = type(settings.server).model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"server.{'.'.join(str(p) for p in error_path(e, data))}: {e['msg']}"
            for e in exc.errors())
        raise ConfigError(f"{problems} (from the command line)") from exc
    return settings.model_copy(update={"server": server})


def preflight(settings: Settings) -> None:
    """Check, before starting a server, what would otherwise fail inside it with a stack
    trace (the configured backend's own check: :func:`proxy.resources.preflight`). Raises
    :class:`ConfigError`."""
    from proxy.resources import preflight as backend_preflight

    backend_preflight(settings)


def _serve(settings: Settings) -> int:
    from proxy.server import serve, serve_processes

    # The port is taken before anything starts: a busy port is a configuration error
    # reported at once, not after the stores, models and worker came up.
    sock = listen_socket(settings.server.host, settings.server.port)
    try:
        if settings.server.processes > 1:
            return serve_processes(settings, sock, settings.server.processes)
        serve(settings, sock)
    finally:
        sock.close()
    return 0


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (``host``, ``port``), for uvicorn to listen on. Raises
    :class:`ConfigError` naming ``server.port`` / ``server.host`` when it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:  # OverflowError: a port outside 0–65535
        sock.close()
        raise ConfigError(f"server.port / server.host: cannot listen on {host}:{port} "
                          f"({getattr(exc, 'strerror', None) or exc}); pick another with "
                          "--port or MEMORY_PROXY_SERVER__PORT") from exc
    return sock


async def _work(settings: Settings, metrics_port: int | None = None) -> None:
    from proxy.resources import open_resources

    if not settings.learning.enabled:
        raise ConfigError("learning.enabled is false: the worker has nothing to do")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    from proxy.alerts import alert_monitor

    async with open_resources(settings) as res:
        assert res.worker is not None
        if metrics_port is not None:  # a thread of prometheus-client, for scrapers
            from prometheus_client import start_http_server

            start_http_server(metrics_port, addr=settings.server.host,
                              registry=res.metrics.registry)
        monitor = alert_monitor(res, gateway=False)
        alerts = asyncio.create_task(monitor.run()) if monitor is not None else None
        try:
            await res.worker.run(stop)
        finally:
            if alerts is not None:
                alerts.cancel()
                await asyncio.gather(alerts, return_exceptions=True)


async def _dead_letters(settings: Settings, args: argparse.Namespace) -> int:
    from proxy.resources import open_resources

    async with open_resources(settings) as res:
        assert res.queue is not None
        dead = await res.queue.dead_letters(limit=10_000)
        if args.drop:
            dropped = await res.queue.drop(args.drop)
            print(f"dropped {int(dropped)} job(s)")
            return 0 if dropped else 1
        if args.requeue or args.requeue_all:
            wanted = [d.id for d in dead] if args.requeue_all else [args.requeue]
            done = [job_id for job_id in wanted if await res.queue.requeue(job_id)]
            print(f"requeued {len(done)} job(s)")
            return 0 if len(done) == len(wanted) else 1
        for item in dead:
            print(f"{item.id}\t{item.kind}\ttenant={item.tenant or '-'}\t"
                  f"attempts={item.attempts}\t{item.last_error[:160]}")
        print(f"{len(dead)} dead job(s)")
    return 0


async def _reindex(settings: Settings) -> int:
    from proxy.memory.reindex import reindex
    from proxy.memory.vectors import MemoryVectors
    from proxy.resources import open_resources

    if settings.memory.embedder.provider == "none":
        raise ConfigError("memory.embedder.provider is none: there is no embedder to "
                          "index memories with")
    async with open_resources(settings) as res:
        assert res.embedder is not None
        report = await reindex(res.store, MemoryVectors(
            res.embedder, ledger=res.ledger, clock=res.clock, metrics=res.metrics,
            timeout_seconds=settings.memory.embedder.timeout_seconds))
        await res.usage.flush()
    print(f"{report.model}: {report.embedded} memories embedded, {report.skipped} changed "
          f"meanwhile, {report.failed} failed")
    return 1 if report.failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = _load(args)
        preflight(settings)
    except ConfigError as exc:
        print(f"memory-proxy: {exc}", file=sys.stderr)
        return 2
    from proxy.logs import configure_logging

    configure_logging(level=settings.server.log_level, fmt=settings.server.log_format)
    try:
        if args.command == "serve":
            return _serve(settings)
        if args.command == "dead-letters":
            return asyncio.run(_dead_letters(settings, args))
        if args.command == "reindex":
            return asyncio.run(_reindex(settings))
        asyncio.run(_work(settings, args.metrics_port))
    except ConfigError as exc:
        print(f"memory-proxy: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
