"""Structured logs: one JSON object per event (or a console renderer for humans).

structlog events and stdlib records (uvicorn, aiohttp, litellm) go through one
``ProcessorFormatter`` so every line has the same shape. Events have snake_case names;
request context rides on contextvars. Prompts, memories and keys are never logged at info.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

import structlog


def configure_logging(*, level: str = "info", fmt: str = "json") -> None:
    """Configure structlog and the root logger (called once by the CLI, never at import)."""
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
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
        foreign_pre_chain=shared,
    ))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "aiohttp", "LiteLLM", "litellm", "LiteLLM Router",
                  "mcp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


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
