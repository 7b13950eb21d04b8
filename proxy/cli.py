"""``memory-proxy serve | worker`` — the command line.

``serve`` runs the gateway (and, in embedded mode, the learning worker in-process);
``worker`` runs only the learning worker against the configured storage, for running
learning in separate processes.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

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
    worker = sub.add_parser("worker", help="run the learning worker only")
    worker.add_argument("--config", help="YAML file")
    return parser


def _load(args: argparse.Namespace) -> Settings:
    settings = load_settings(args.config)
    server = settings.server.model_copy(update={
        k: v for k, v in {
            "host": getattr(args, "host", None), "port": getattr(args, "port", None),
            "run_worker": False if getattr(args, "no_worker", False) else None,
        }.items() if v is not None
    })
    return settings.model_copy(update={"server": server})


def _serve(settings: Settings) -> None:
    import uvicorn

    from proxy.app import create_app

    uvicorn.run(
        create_app(settings), host=settings.server.host, port=settings.server.port,
        log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=10,
    )


async def _work(settings: Settings) -> None:
    from proxy.resources import open_resources

    if not settings.learning.enabled:
        raise ConfigError("learning.enabled is false: the worker has nothing to do")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with open_resources(settings) as res:
        assert res.worker is not None
        await res.worker.run(stop)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = _load(args)
    except ConfigError as exc:
        print(f"memory-proxy: {exc}", file=sys.stderr)
        return 2
    from proxy.logs import configure_logging

    configure_logging(level=settings.server.log_level, fmt=settings.server.log_format)
    try:
        if args.command == "serve":
            _serve(settings)
        else:
            asyncio.run(_work(settings))
    except ConfigError as exc:
        print(f"memory-proxy: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
