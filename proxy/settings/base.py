"""What every settings section shares: the environment prefix, LiteLLM's ``os.environ/NAME``
indirection, the reserved global namespace, :class:`ConfigError` and the frozen section base."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict

from proxy.errors import MemoryProxyError

ENV_PREFIX = "MEMORY_PROXY_"
# The namespace of system memories, read by every tenant's recall and written only with a
# global admin key; refused as a tenant name.
GLOBAL_NAMESPACE = "__global__"
ENV_REFERENCE = "os.environ/"


class ConfigError(MemoryProxyError):
    """The configuration cannot be used; the message names the offending setting."""

    log_traceback = True


def resolve_env_reference(value: str, *, setting: str) -> str | None:
    """Resolve LiteLLM's ``os.environ/NAME`` indirection.

    Returns the environment variable's value, ``None`` when the variable is unset, or
    ``value`` itself when it is not a reference. ``setting`` is only used in messages.
    """
    if not value.startswith(ENV_REFERENCE):
        return value
    name = value.removeprefix(ENV_REFERENCE).strip()
    if not name:
        raise ValueError(f"{setting}: '{value}' names no environment variable")
    return os.environ.get(name)


class Section(BaseModel):
    """A config section: unknown keys are refused, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
