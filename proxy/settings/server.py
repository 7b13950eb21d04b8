"""``server``, ``identity`` and ``upstream``: the HTTP server, the headers that name users
and conversations, and the connection to the model providers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from proxy.settings.base import Section


class IdentitySettings(Section):
    user_header: str = "X-User-Id"
    conversation_header: str = "X-Conversation-Id"
    memory_header: str = "X-Memory"
    channel_header: str = "X-Memory-Channel"
    group_header: str = "X-Memory-Group-Id"
    # Accept the OpenAI body ``user`` / ``metadata.user_id`` / ``safety_identifier``
    # from keys that are not bound to one user.
    accept_body_user: bool = True


class UpstreamSettings(Section):
    # auto: relay OpenAI-compatible upstreams with aiohttp, litellm for the rest.
    transport: Literal["auto", "litellm"] = "auto"
    timeout_seconds: float = Field(default=600.0, gt=0)
    connect_timeout_seconds: float = Field(default=10.0, gt=0)
    max_connections: int = Field(default=200, ge=1)
    # Retry once without memory when the upstream rejects the prompt as too long.
    retry_without_memory_on_overflow: bool = True


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    # Run the learning worker inside the gateway process (`serve --no-worker` turns it off:
    # with Redis storage, gateway pods feed a queue that `memory-proxy worker`s drain).
    run_worker: bool = True
    # Larger chat bodies are refused with 413 (base64 images make bodies big).
    max_request_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    # After SIGTERM, in-flight streams may run this long;
    # the rest end with an SSE error event (proxy/shutdown.py). 30 s: Kubernetes' default
    # terminationGracePeriodSeconds, which the Helm chart sets to this plus preStop + 10 s.
    shutdown_grace_seconds: float = Field(default=30.0, ge=0, le=3600)
    # Gateway processes sharing the port (`serve --processes N`); the learning worker runs
    # in the first one only. 1: one process, no supervisor.
    processes: int = Field(default=1, ge=1, le=256)
    # The access log's user field: "hash" (default; sha256 of tenant and user, 16 hex
    # digits), "plain" (the user id as sent) or "off" (no user field).
    access_log: bool = True
    access_log_user: Literal["hash", "plain", "off"] = "hash"
