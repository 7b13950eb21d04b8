"""Running the gateway under uvicorn: one process, or ``--processes N`` on one port.

:class:`GatewayServer` is uvicorn's server with graceful shutdown wired in: on SIGTERM it
stops accepting connections and starts the app's :class:`~proxy.shutdown.Drain` (streams get
``server.shutdown_grace_seconds``; uvicorn's hard limit is that plus
:data:`~proxy.shutdown.HARD_STOP_MARGIN_SECONDS`).

:func:`serve_processes` runs N such servers in child processes (``multiprocessing``'s
``spawn`` context, as uvicorn's own ``--workers``) accepting on one socket the parent bound;
the learning worker runs only in child 0 (restarted as child 0 if it dies). Once every
child accepts connections the parent logs one ``gateway_listening`` line
(:func:`log_listening`; a single process logs it itself). Prometheus
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
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as EventType
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
    """uvicorn's server; its shutdown first starts the app's drain, and ``on_ready`` is
    called once the app has started and the socket accepts connections."""

    def __init__(self, config: uvicorn.Config, drain: Drain,
                 on_ready: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.drain = drain
        self.on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_ready is not None:
            self.on_ready()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.drain.begin()
        await super().shutdown(sockets)


def log_listening(settings: Settings, sock: socket.socket, processes: int) -> None:
    """The one ``gateway_listening`` line of a ready gateway: ``url``, ``host``, ``port``
    (the bound one, so ``--port 0`` shows the port picked), ``processes``, storage
    ``backend``, and whether this gateway runs the learning ``worker``. uvicorn logs no
    "running on" line of its own here: it is handed a socket already bound
    (:func:`proxy.cli.listen_socket`), and it only announces sockets it binds itself."""
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.info("gateway_listening", url=f"http://{shown}:{port}", host=host, port=port,
             processes=processes, backend=settings.storage.backend,
             worker=settings.server.run_worker and settings.learning.enabled)


def serve(settings: Settings, sock: socket.socket,
          on_ready: Callable[[], None] | None = None) -> None:
    """Run one gateway on the bound, not yet listening ``sock`` until SIGTERM/SIGINT.
    ``on_ready`` is called once it accepts connections; by default it logs
    :func:`log_listening` (one process)."""
    from proxy.app import create_app

    app = create_app(settings)
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="on",
        timeout_graceful_shutdown=int(settings.server.shutdown_grace_seconds
                                      + HARD_STOP_MARGIN_SECONDS),
    )
    if on_ready is None:
        def on_ready() -> None:
            log_listening(settings, sock, 1)
    server = GatewayServer(config, app.state.drain, on_ready)
    server.run(sockets=[sock])
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)


def _child(settings: Settings, index: int, sock: socket.socket, ready: EventType) -> None:
    """A child of :func:`serve_processes` (a fresh interpreter: logging set up again);
    ``ready`` is set once it accepts connections."""
    from proxy.logs import configure_logging

    configure_logging(level=settings.server.log_level, fmt=settings.server.log_format)
    structlog.contextvars.bind_contextvars(process=index)
    server = settings.server.model_copy(
        update={"run_worker": settings.server.run_worker and index == 0})
    try:
        serve(settings.model_copy(update={"server": server}), sock, ready.set)
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
    ready = [spawn.Event() for _ in range(processes)]
    announced = False
    stopping = False
    status = 0

    def start(index: int) -> None:
        child = spawn.Process(target=_child, args=(settings, index, sock, ready[index]),
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
            if not announced and not stopping and all(e.is_set() for e in ready):
                log_listening(settings, sock, processes)  # once, when every child is up
                announced = True
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
