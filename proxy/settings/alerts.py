"""``alerts``: the JSON webhook for conditions that last."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from proxy.settings.base import ENV_REFERENCE, Section, resolve_env_reference


class AlertSettings(Section):
    """``alerts``: a JSON webhook for conditions that last (operators are told of
    sustained failures, not of blips). Off
    while ``webhook_url`` is unset. A condition must hold for ``for_seconds`` before it
    fires (a blip is not reported); while it holds it is re-sent at most every
    ``repeat_seconds``; when it clears a ``resolved`` message follows. ``secret`` signs each
    body with HMAC-SHA256 (header ``X-Memory-Proxy-Signature``, see :mod:`proxy.alerts`).
    Both secrets are usually ``os.environ/NAME``."""

    webhook_url: SecretStr | None = None
    secret: SecretStr | None = None
    for_seconds: float = Field(default=120.0, ge=0)
    repeat_seconds: float = Field(default=3600.0, gt=0)
    check_interval_seconds: float = Field(default=15.0, gt=0)
    timeout_seconds: float = Field(default=5.0, gt=0)
    # upstream_failing: share of chat requests in a check interval that failed upstream.
    upstream_failure_ratio: float = Field(default=0.5, gt=0, le=1)

    @field_validator("webhook_url", "secret", mode="before")
    @classmethod
    def _from_env(cls, value: Any) -> Any:
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str) and value.startswith(ENV_REFERENCE):
            return resolve_env_reference(value, setting="alerts")  # unset → off
        return value

    @field_validator("webhook_url")
    @classmethod
    def _http_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parts = urlsplit(value.get_secret_value())
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("alerts.webhook_url must be an http:// or https:// URL")
        return value
