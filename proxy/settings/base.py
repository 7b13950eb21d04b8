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
# The learning namespace of a group chat is ``group:<group id>``: its buffer, fingerprints
# and conversation record live under that user id, so no end user may be called so.
GROUP_PREFIX = "group:"
ENV_REFERENCE = "os.environ/"


def reserved_user_id(user: str) -> bool:
    """Whether ``user`` is an id the gateway keeps for itself and never gives an end user:
    a group chat's namespace (any id starting with :data:`GROUP_PREFIX`) or the global
    namespace (:data:`GLOBAL_NAMESPACE`)."""
    return user.startswith(GROUP_PREFIX) or user == GLOBAL_NAMESPACE


RESERVED_IDS_RULE = (f"ids starting with '{GROUP_PREFIX}' and the id '{GLOBAL_NAMESPACE}' "
                     "are reserved for the gateway's own namespaces")
# The longest user, conversation or group id (characters): ids are key parts in both
# stores and appear in logs and audit events (docs/design.md#identity).
MAX_ID_LENGTH = 256


ID_RULE = (f"an id is at most {MAX_ID_LENGTH} characters without control characters "
           "(NUL, tab, line breaks, escape, DEL)")


def id_problem(value: str) -> str | None:
    """What breaks the id rule in ``value`` (at most :data:`MAX_ID_LENGTH` characters
    without a C0 control character or DEL — the rule for every id a caller names: user,
    conversation, group), worded to follow the id's name — ``"is 300 characters long"``,
    ``"holds the control character U+0009 at character 4"`` — or ``None`` when it keeps
    the rule. The length is reported first."""
    if len(value) > MAX_ID_LENGTH:
        return f"is {len(value)} characters long"
    for at, char in enumerate(value, 1):
        if ord(char) < 32 or ord(char) == 127:
            return f"holds the control character U+{ord(char):04X} at character {at}"
    return None


def user_id_problem(user: str) -> str | None:
    """Why ``user`` cannot name an end user, or ``None`` when it can: blank, longer than
    :data:`MAX_ID_LENGTH` characters, holding a control character, or reserved
    (:func:`reserved_user_id`). The one rule for ids from a header, a body, a JWT and a
    key binding alike."""
    if not user.strip():
        return "it is blank"
    problem = id_problem(user)
    if problem is not None:
        return f"it {problem}; {ID_RULE}"
    if reserved_user_id(user):
        return RESERVED_IDS_RULE
    return None


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
