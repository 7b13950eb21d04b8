"""Structured logs: one JSON object per event (or a console renderer for humans).

structlog events and stdlib records (uvicorn, aiohttp, litellm) go through one
``ProcessorFormatter`` so every line has the same shape. Events have snake_case names;
request context rides on contextvars. Prompts, memories and keys are never logged at info.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson
import structlog

HANDLER_NAME = "memory-proxy"
"""The name of the root handler :func:`configure_logging` installs."""


def configure_logging(*, level: str = "info", fmt: str = "json",
                      stream: TextIO | None = None) -> None:
    """Configure structlog and the root logger (called once by the CLI, never at import).

    ``stream``: where every line goes; ``sys.stderr`` when ``None``."""
    out = sys.stderr if stream is None else stream
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer()
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
        foreign_pre_chain=shared,
    ))
    root = logging.getLogger()
    global _json_stream  # noqa: PLW0603 - set once per process, read by json_line()
    _json_stream = out if fmt == "json" else None
    root.handlers = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "aiohttp", "LiteLLM", "litellm", "LiteLLM Router",
                  "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


_json_stream: TextIO | None = None


def json_line(logger: logging.Logger, event: str, fields: dict[str, Any],
              *, level: int = logging.INFO) -> bool:
    """Write one JSON log line with the shape of every other line (``event``, ``level``,
    ``logger``, ``timestamp``, the bound contextvars) straight to stderr, skipping the
    stdlib/structlog formatter chain — for the per-request access line, where that chain
    costs an order of magnitude more than the line itself. Returns ``False`` (nothing
    written) unless :func:`configure_logging` set up JSON logs; the caller then logs
    through structlog (tests, console format).

    A line that cannot be written (the stream closed, a broken pipe, a full disk) is
    dropped and the call still returns ``True``: the request it describes must not fail
    with it — the stdlib handlers drop a record the same way (``Handler.handleError``)."""
    stream = _json_stream
    if stream is None:
        return False
    if not logger.isEnabledFor(level):
        return True
    line = {**structlog.contextvars.get_contextvars(), **fields, "event": event,
            "level": logging.getLevelName(level).lower(), "logger": logger.name,
            "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z")}
    with contextlib.suppress(OSError, ValueError):  # ValueError: a closed file
        stream.write(orjson.dumps(line, default=str).decode() + "\n")
    return True


class LogThrottle:
    """At most one log line per ``interval_seconds`` for each key (an event name).

    For warnings that can fire on every request when a dependency is down or overloaded
    (an embedder past its deadline, recall timeouts): the metrics count every occurrence
    (``memory_proxy_memory_outcomes_total``), the log says it is happening and how often —
    not 13,000 identical lines a minute (seen in ``bench.gateway`` with local embeddings
    at 32 concurrent requests on one core). ``clock``: seconds, monotonic.
    """

    def __init__(self, interval_seconds: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval_seconds
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str) -> int | None:
        """``None`` when this occurrence should not be logged; otherwise how many were held
        back since the last line for ``key`` (0 the first time)."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)
