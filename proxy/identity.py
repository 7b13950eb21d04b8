"""Who the end user is, which conversation this is, and what memory may do
(docs/design.md#identity).

One function, :func:`resolve_identity`, feeds retrieval, learning, the management API and
logging alike, so a user id written into the body never reaches another user's memory.
Precedence for the end user:

1. the user a gateway key is bound to (body and headers cannot override it);
2. the configured header (default ``X-User-Id``);
3. the body ``user`` field, then ``metadata.user_id``, then ``safety_identifier``
   (only from keys that are not bound, and only when ``identity.accept_body_user``).

No user → plain pass-through: no memory, no learning. The memory namespace is always
(tenant, user), the tenant coming from the authenticated key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from proxy.auth import Principal
from proxy.errors import InvalidRequestError
from proxy.request import Message, message_text
from proxy.settings import (
    ID_RULE,
    IdentitySettings,
    id_problem,
    reserved_user_id,
    user_id_problem,
)

MemoryMode = Literal["on", "off", "read-only", "write-only"]
Channel = Literal["private", "group"]
_MODES: dict[str, MemoryMode] = {
    "on": "on", "off": "off", "read-only": "read-only", "write-only": "write-only",
    "readonly": "read-only", "writeonly": "write-only",
}


@dataclass(frozen=True, slots=True)
class Identity:
    """The resolved caller of one request."""

    tenant: str
    user: str | None
    conversation: str
    channel: Channel = "private"
    group: str | None = None
    mode: MemoryMode = "on"
    user_source: str = "none"  # key | header | body | metadata | none
    # The client named no conversation: ``conversation`` was derived from the messages
    # (the chat route then keeps chats apart: :mod:`proxy.conversations`).
    derived: bool = False

    @property
    def can_read(self) -> bool:
        """Memory may be injected into this request."""
        return self.user is not None and self.mode in ("on", "read-only")

    @property
    def can_write(self) -> bool:
        """This exchange may be learned from (subject to the learning switches)."""
        return self.user is not None and self.mode in ("on", "write-only")


def header_text(value: str | None) -> str | None:
    """An id header as the client wrote it. HTTP carries header bytes, and ASGI servers
    hand them over decoded as Latin-1, so a UTF-8 id (``X-User-Id: zh用户``, as curl and
    most clients send it) arrives as mojibake; it is re-read as UTF-8 when its bytes are
    valid UTF-8, and kept as it came otherwise. The same user named in a header and in the
    body is then one user."""
    if value is None or value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def resolve_user(
    principal: Principal,
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None,
    settings: IdentitySettings,
) -> tuple[str | None, str]:
    """The end user id and where it came from (``key``/``header``/``body``/``metadata``).

    Raises :class:`InvalidRequestError` for an id that is empty, longer than 256 characters
    or contains control characters, for an id the gateway reserves for its own namespaces
    (:func:`~proxy.settings.reserved_user_id`: a group chat's ``group:<id>``, the global
    namespace): the one user-id rule (:func:`~proxy.settings.user_id_problem`), also held
    by JWTs and key bindings; and for a ``metadata.user_id`` that is not a string, whichever
    source names the user.
    """
    metadata = body.get("metadata") if body is not None else None
    meta_user = metadata.get("user_id") if isinstance(metadata, dict) else None
    if meta_user is not None and not isinstance(meta_user, str):
        # OpenAI's metadata values are strings; a number here is a caller's mistake, refused
        # whichever source names the user (as a non-string ``user`` is), so it is never
        # silently ignored nor silently read.
        raise InvalidRequestError("metadata.user_id must be a string.",
                                  param="metadata.user_id", code="invalid_type")
    if principal.bound_user is not None:
        return principal.bound_user, "key"
    header_value = header_text(headers.get(settings.user_header.lower()))
    if header_value is not None and header_value.strip():
        return _check_user(header_value.strip(), settings.user_header), "header"
    if body is None or not settings.accept_body_user:
        return None, "none"
    user = body.get("user")
    if isinstance(user, str) and user.strip():
        return _check_user(user.strip(), "user"), "body"
    if isinstance(meta_user, str) and meta_user.strip():
        return _check_user(meta_user.strip(), "metadata.user_id"), "metadata"
    safety = body.get("safety_identifier")
    if isinstance(safety, str) and safety.strip():
        return _check_user(safety.strip(), "safety_identifier"), "body"
    return None, "none"


def resolve_identity(
    principal: Principal,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    messages: list[Message],
    settings: IdentitySettings,
) -> Identity:
    """Resolve tenant, user, conversation, channel and memory mode for a chat request.

    Raises :class:`InvalidRequestError` for an unknown ``X-Memory`` value, an unknown
    channel, a group channel without a group id, or a malformed id.
    """
    user, source = resolve_user(principal, headers, body, settings)
    mode = _mode(headers.get(settings.memory_header.lower()), settings.memory_header)
    channel, group = _channel(headers, body, settings)
    conversation = _conversation(headers, body, settings)
    if conversation is None and group is not None:
        # A group chat is one long conversation: every participant's request shares it.
        seed = "\x1f".join((principal.tenant, "group", group))
        conversation = "grp_" + hashlib.sha256(seed.encode()).hexdigest()[:32]
    derived = conversation is None
    if conversation is None:
        conversation = derive_conversation_id(
            tenant=principal.tenant, user=user, channel=channel, group=group, messages=messages
        )
    return Identity(
        tenant=principal.tenant,
        user=user,
        conversation=conversation,
        channel=channel,
        group=group,
        mode=mode,
        user_source=source,
        derived=derived,
    )


def derive_conversation_id(
    *, tenant: str, user: str | None, channel: str, group: str | None, messages: list[Message]
) -> str:
    """A stable id for a conversation the client did not name, from its first request
    (the chat route refines it per history: :class:`proxy.conversations.ConversationChains`).

    sha256 over tenant, user, channel, group and the first user message's text: clients
    resend the whole history each turn, so the first user message is the same on every turn
    of one conversation while two users never share an id. System messages are left out
    because apps often put the date in them.
    """
    first_user = next((m for m in messages if m.get("role") == "user"), None)
    seed = "\x1f".join(
        [tenant, user or "", channel, group or "", message_text(first_user) if first_user else ""]
    )
    return "conv_" + hashlib.sha256(seed.encode()).hexdigest()[:32]


def _mode(raw: str | None, header: str) -> MemoryMode:
    if raw is None or not raw.strip():
        return "on"
    mode = _MODES.get(raw.strip().lower())
    if mode is None:
        raise InvalidRequestError(
            f"Header {header} must be one of on, off, read-only, write-only (got {raw!r}).",
            param=header, code="invalid_header",
        )
    return mode


def resolve_channel(
    headers: Mapping[str, str], body: Mapping[str, Any], settings: IdentitySettings
) -> tuple[Channel, str | None]:
    """The channel a request names (``X-Memory-Channel``, default private) and, in a group,
    its group id (``X-Memory-Group-Id`` or ``metadata.group_id``). Raises
    :class:`InvalidRequestError` for an unknown channel, a group channel without a group id
    or a malformed group id."""
    return _channel(headers, body, settings)


def _channel(
    headers: Mapping[str, str], body: Mapping[str, Any], settings: IdentitySettings
) -> tuple[Channel, str | None]:
    raw = (headers.get(settings.channel_header.lower()) or "private").strip().lower()
    if raw not in ("private", "group"):
        raise InvalidRequestError(
            f"Header {settings.channel_header} must be 'private' or 'group' (got {raw!r}).",
            param=settings.channel_header, code="invalid_header",
        )
    if raw == "private":
        return "private", None
    group = header_text(headers.get(settings.group_header.lower()))
    metadata = body.get("metadata")
    if not group and isinstance(metadata, dict) and isinstance(metadata.get("group_id"), str):
        group = metadata["group_id"]
    if not group or not group.strip():
        raise InvalidRequestError(
            f"A group channel needs a group id: send header {settings.group_header} "
            "or metadata.group_id.",
            param=settings.group_header, code="missing_required_parameter",
        )
    return "group", _check_id(group.strip(), settings.group_header)


def _conversation(
    headers: Mapping[str, str], body: Mapping[str, Any], settings: IdentitySettings
) -> str | None:
    value = header_text(headers.get(settings.conversation_header.lower()))
    if value and value.strip():
        return _check_id(value.strip(), settings.conversation_header)
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        meta = metadata.get("conversation_id")
        if isinstance(meta, str) and meta.strip():
            return _check_id(meta.strip(), "metadata.conversation_id")
    return None


def _check_id(value: str, param: str) -> str:
    """``value`` when it keeps the id rule; else :class:`InvalidRequestError` (400 naming
    ``param``) saying what breaks it (:func:`~proxy.settings.id_problem`)."""
    problem = id_problem(value)
    if problem is not None:
        raise InvalidRequestError(f"{param} {problem}; {ID_RULE}.", param=param,
                                  code="invalid_value")
    return value


def _check_user(value: str, param: str) -> str:
    """An end user id named by ``param``: :func:`_check_id`'s rules, and none of the ids
    the gateway reserves (a user called ``group:g1`` would share a group chat's learning
    namespace)."""
    _check_id(value, param)
    if reserved_user_id(value):
        raise InvalidRequestError(f"{param} {value!r} cannot name an end user: "
                                  f"{user_id_problem(value)}.", param=param,
                                  code="invalid_value")
    return value
