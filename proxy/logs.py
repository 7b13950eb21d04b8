"""Structured logs: one JSON object per event (or a console renderer for humans).

structlog events and stdlib records (uvicorn, aiohttp, litellm) go through one
``ProcessorFormatter`` so every line has the same shape. Events have snake_case names;
request context rides on contextvars. Prompts, memories and keys are never logged at info.
"""

from __future__ import annotations

import logging
import sys

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
    for noisy in ("httpx", "httpcore", "aiohttp", "LiteLLM", "litellm", "LiteLLM Router"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
