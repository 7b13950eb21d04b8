"""Running the gateway under uvicorn: one process, or ``--processes N`` on one port.

:class:`GatewayServer` is uvicorn's server with graceful shutdown wired in: on SIGTERM it
stops accepting connections and starts the app's :class:`~proxy.shutdown.Drain` (streams get
``server.shutdown_grace_seconds``; uvicorn's hard limit is that plus
:data:`~proxy.shutdown.HARD_STOP_MARGIN_SECONDS`).

:func:`serve_processes` runs N such servers in child processes (``multiprocessing``'s
``spawn`` context, as uvicorn's own ``--workers``) accepting on one socket the parent bound;
the learning worker runs only in child 0 (restarted as child 0 if it dies). Prometheus
metrics are aggregated across the children with prometheus-client's multiprocess mode: the
parent points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before the children start,
``/metrics`` in any child reads every child's files (:meth:`proxy.metrics.Metrics.render`),
and the directory is removed when the parent exits. SIGTERM or SIGINT to the parent is
passed on to every child, and the parent exits when all of them have drained.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import time
from multiprocessing.process import BaseProcess
from types import FrameType

import structlog
import uvicorn

from proxy.settings import Settings
from proxy.shutdown import HARD_STOP_MARGIN_SECONDS, Drain

log = structlog.get_logger("proxy.server")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
STARTUP_FAILURE = 3  # a child's exit code when its app could not start (as uvicorn's)
RESTART_PAUSE_SECONDS = 1.0  # before restarting a child that died


class GatewayServer(uvicorn.Server):
    """uvicorn's server; its shutdown first starts the app's drain."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.drain.begin()
        await super().shutdown(sockets)


def serve(settings: Settings, sock: socket.socket) -> None:
    """Run one gateway on the bound, not yet listening ``sock`` until SIGTERM/SIGINT."""
    from proxy.app import create_app

    app = create_app(settings)
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on",
        timeout_graceful_shutdown=int(settings.server.shutdown_grace_seconds
                                      + HARD_STOP_MARGIN_SECONDS),
    )
    server = GatewayServer(config, app.state.drain)
    server.run(sockets=[sock])
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)


def _child(settings: Settings, index: int, sock: socket.socket) -> None:
    """A child of :func:`serve_processes` (a fresh interpreter: logging set up again)."""
    from proxy.logs import configure_logging

    configure_logging(level=settings.server.log_level, fmt=settings.server.log_format)
    structlog.contextvars.bind_contextvars(process=index)
    server = settings.server.model_copy(
        update={"run_worker": settings.server.run_worker and index == 0})
    try:
        serve(settings.model_copy(update={"server": server}), sock)
    finally:
        sock.close()


def serve_processes(settings: Settings, sock: socket.socket, processes: int) -> int:
    """Run ``processes`` gateway children on ``sock`` until SIGTERM/SIGINT; returns the exit
    status (0, or :data:`STARTUP_FAILURE` when a child could not start)."""
    from prometheus_client import multiprocess

    metrics_dir = tempfile.mkdtemp(prefix="memory-proxy-metrics-")
    os.environ[MULTIPROC_ENV] = metrics_dir
    spawn = multiprocessing.get_context("spawn")
    children: dict[int, BaseProcess] = {}
    stopping = False
    status = 0

    def start(index: int) -> None:
        child = spawn.Process(target=_child, args=(settings, index, sock),
                              name=f"memory-proxy-{index}")
        child.start()
        children[index] = child
        log.info("gateway_process_started", index=index, pid=child.pid)

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            if child.pid is not None and child.exitcode is None:
                os.kill(child.pid, signum if signum == signal.SIGINT else signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index in range(processes):
            start(index)
        while children:
            time.sleep(0.2)
            for index, child in list(children.items()):
                if child.exitcode is None:
                    continue
                child.join()
                assert child.pid is not None
                multiprocess.mark_process_dead(child.pid)  # type: ignore[no-untyped-call]
                del children[index]
                if stopping:
                    continue
                if child.exitcode == STARTUP_FAILURE:
                    log.error("gateway_process_failed_to_start", index=index, pid=child.pid)
                    status = STARTUP_FAILURE
                    stop(signal.SIGTERM, None)
                    continue
                log.error("gateway_process_died", index=index, pid=child.pid,
                          exitcode=child.exitcode)
                time.sleep(RESTART_PAUSE_SECONDS)
                start(index)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.environ.pop(MULTIPROC_ENV, None)
    return status
