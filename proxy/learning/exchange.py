"""What the gateway hands to learning after a completed reply
(docs/design.md#what-is-learned-from).

An :class:`Exchange` holds only messages that came from the client (never the spliced
memory block, which would be learned again every turn) plus the assistant's reply as
context. Tool results and tool-call arguments are left out: they are not statements of the
user (docs/design.md#what-is-learned-from). Each message carries a fingerprint — a hash of
(tenant, user, role, normalised text) — so that clients resending the whole history every
turn never get a message learned twice, even after they truncate history or the
conversation id changes ("nothing is learned twice" is about resent history:
docs/design.md#batching). The request's new user message is the exception: stating a known
fact again is evidence (docs/design.md#evidence), so it is learned again in any
conversation — unless the same request (same conversation, same messages) was queued within
:data:`RETRY_WINDOW_SECONDS` (a retry).

**Group chats: display names are identity only for trusted callers.** In a group channel
the messages name their speakers with OpenAI's ``name`` field. An *app key* (a server-side
key that may already name any user with ``X-User-Id``, docs/design.md#group-chats) is
trusted to name the speakers: its group turns are buffered in the group's namespace
(:func:`group_namespace`) and each line is attributed to the participant its name resolves
to, and its requester's display name is bound to the requester (``speaker_name``). A
*user-bound key* (and, later, a JWT user) speaks only for its own user: :func:`as_told_by`
rewrites its group turn into the caller's own private knowledge — the caller's latest
message is theirs, a line under another ``name`` becomes a report ``[<name> said] …`` that
can only teach facts about that person (subject = that name) into the caller's memory —
and it binds no display name, so it can neither write into another participant's memory or
profile nor claim or shadow their name.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from proxy.learning.fingerprints import UNKEYED, Fingerprinter
from proxy.memory.inject import strip_blocks
from proxy.memory.text import normalize
from proxy.request import Message, message_text
from proxy.settings import GROUP_PREFIX

LEARNABLE_ROLES = frozenset({"user", "assistant"})


@dataclass(frozen=True, slots=True)
class TranscriptMessage:
    role: str  # "user" | "assistant"
    text: str
    fingerprint: str
    name: str | None = None
    images: tuple[str, ...] = ()  # image URLs (or data URLs) the user shared
    # The key of the request that first carried this user message (:func:`request_key`
    # over the conversation and the messages up to this one; set by :func:`transcript`).
    request: str | None = None
    # The request's new user message: learned even when its text was seen before
    # (repeated mention is evidence, docs/design.md#evidence) unless ``request`` was seen
    # within RETRY_WINDOW_SECONDS (a retry, or a later request that already carried it).
    new: bool = False
    # The fingerprints this message may be recorded under from before a key rotation or
    # before keying (proxy.learning.fingerprints): seen when any of them is.
    aliases: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "text": self.text, "fp": self.fingerprint,
                                "name": self.name, "images": list(self.images)}
        if self.request is not None:
            data["rq"] = self.request
        if self.new:
            data["new"] = True
        if self.aliases:
            data["fpa"] = list(self.aliases)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TranscriptMessage:
        return cls(role=data["role"], text=data["text"], fingerprint=data["fp"],
                   name=data.get("name"), images=tuple(data.get("images") or ()),
                   request=data.get("rq"), new=bool(data.get("new")),
                   aliases=tuple(data.get("fpa") or ()))


# Images kept for learning: at most this many per message, each at most this many characters
# of URL (a data URL of ~2 MB of image); larger ones are not learned from.
MAX_IMAGES_PER_MESSAGE = 4
MAX_IMAGE_URL_CHARS = 2_800_000


def message_images(message: Message) -> tuple[str, ...]:
    """Image URLs of a user message's ``image_url`` parts, within the limits above."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list):
        return ()
    urls: list[str] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if isinstance(url, str) and 0 < len(url) <= MAX_IMAGE_URL_CHARS:
                urls.append(url)
    return tuple(urls[:MAX_IMAGES_PER_MESSAGE])


@dataclass(frozen=True, slots=True)
class Exchange:
    """One completed turn, as queued for learning."""

    id: str
    tenant: str
    user: str
    conversation: str
    channel: str  # "private" | "group"
    group: str | None
    model: str
    messages: tuple[TranscriptMessage, ...]
    at: float  # epoch seconds
    # Who sent the request and the display name on their latest message: the gateway learns
    # which names a user goes by (for group attribution). In a group, ``user`` is the
    # group's learning namespace (:func:`group_namespace`) and ``speaker`` the requester.
    speaker: str | None = None
    speaker_name: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "tenant": self.tenant, "user": self.user,
            "conversation": self.conversation, "channel": self.channel, "group": self.group,
            "model": self.model, "messages": [m.to_json() for m in self.messages], "at": self.at,
            "speaker": self.speaker, "speaker_name": self.speaker_name,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Exchange:
        return cls(
            id=data["id"], tenant=data["tenant"], user=data["user"],
            conversation=data["conversation"], channel=data["channel"], group=data.get("group"),
            model=data["model"],
            messages=tuple(TranscriptMessage.from_json(m) for m in data["messages"]),
            at=float(data["at"]), speaker=data.get("speaker"),
            speaker_name=data.get("speaker_name"),
        )




def as_told_by(messages: list[Message]) -> list[Message]:
    """A group transcript sent by an untrusted caller (a user-bound key), as the caller's
    own knowledge: the latest user message is the caller's own (its ``name`` dropped); an
    earlier user message under a ``name`` becomes a user message ``[<name> said] <text>``
    (text only: another person's images are not the caller's to share); unnamed user
    messages are the caller's; assistant and other messages pass unchanged."""
    latest = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    out: list[Message] = []
    for index, message in enumerate(messages):
        if message.get("role") != "user":
            out.append(message)
            continue
        name = message.get("name")
        name = name.strip() if isinstance(name, str) else ""
        rest = {k: v for k, v in message.items() if k != "name"}
        if index == latest or not name:
            out.append(rest)
            continue
        text = message_text(message).strip()
        if text:
            out.append({"role": "user", "content": f"[{name[:80]} said] {text}"})
    return out


def group_namespace(group: str) -> str:
    """The learning namespace of a group chat: its messages are buffered and fingerprinted
    once for the group, whichever participant's request carried them."""
    return GROUP_PREFIX + group


# Characters of one message kept for learning (buffered, fingerprinted, shown to the
# learning model); longer ones keep their head and tail around a visible marker. A fact is
# at most 4000 characters (records.MAX_CONTENT_CHARS): a longer message is a paste.
MAX_MESSAGE_CHARS = 4000


def truncation_marker(cut: int) -> str:
    return f" […{cut} characters cut…] "


def clip_message(text: str, max_chars: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` when it has at most ``max_chars`` characters, else its head (3/4) and tail
    around :func:`truncation_marker` — at most ``max_chars`` characters, the marker
    included, so clipping a clipped text changes nothing."""
    if len(text) <= max_chars:
        return text
    keep = max(0, max_chars - len(truncation_marker(len(text))))
    head = keep * 3 // 4
    tail = keep - head
    end = text[len(text) - tail:] if tail else ""
    return text[:head] + truncation_marker(len(text) - keep) + end


def fingerprint_seed(*, tenant: str, user: str, role: str, text: str,
                     images: tuple[str, ...] = ()) -> str:
    """What a message's fingerprint is computed over: tenant, user, role, normalised text
    and the SHA-256 of each image URL."""
    shown = [hashlib.sha256(url.encode()).hexdigest() for url in images]
    return "\x1f".join((tenant, user, role, normalize(text), *shown))


def fingerprint(*, tenant: str, user: str, role: str, text: str,
                images: tuple[str, ...] = (), keys: Fingerprinter = UNKEYED) -> str:
    """Stable id of a message's content for one user (hex, 32 chars), keyed by ``keys``
    (:mod:`proxy.learning.fingerprints`)."""
    return keys(fingerprint_seed(tenant=tenant, user=user, role=role, text=text,
                                 images=images))


# How long a request (same conversation, same messages) counts as a retry of one already
# queued: client SDKs retry within seconds to a few minutes (the openai SDK backs off up to
# 8 s per attempt; proxies and users retry by hand), so 10 minutes covers them.
RETRY_WINDOW_SECONDS = 600.0


def request_keys(*, tenant: str, user: str, conversation: str,
                 fingerprints: list[str]) -> list[str]:
    """For each message, the id of a request ending with it: the same conversation with
    the same messages so far gives the same key (``rq_`` + 32 hex digits of SHA-256 over
    tenant, user, conversation and the fingerprints; one running hash, linear time)."""
    running = hashlib.sha256("\x1f".join((tenant, user, conversation)).encode())
    keys = []
    for value in fingerprints:
        running.update(b"\x1f" + value.encode())
        keys.append("rq_" + running.copy().hexdigest()[:32])
    return keys


def _open_user_turn(messages: list[Message]) -> int | None:
    """Index of the latest user message when no assistant message follows it (the message
    this request asks the assistant to answer), else ``None`` (a tool-call round trip
    resends an already answered user message)."""
    for index in range(len(messages) - 1, -1, -1):
        role = messages[index].get("role")
        if role == "assistant":
            return None
        if role == "user":
            return index
    return None


def transcript(
    *, tenant: str, user: str, messages: list[Message], reply: str, limit: int,
    conversation: str | None = None, keys: Fingerprinter = UNKEYED,
) -> tuple[TranscriptMessage, ...]:
    """The learnable tail of a conversation: the last ``limit`` user/assistant text messages
    of the client's list plus the new assistant ``reply``. Memory blocks are stripped as a
    defence (the client never sees ours, but another gateway's may be in its history).

    With ``conversation`` given, each user message carries in ``request`` the key of the
    request that ended with it (:func:`request_keys`), and the request's new user message
    (the latest one, when no assistant message follows it) is marked ``new``: it is a new
    statement even when its text was said before; every earlier message is resent history,
    known by its per-user fingerprint (docs/design.md#batching) — and when history reaches
    the queue before the request that carried it new (two workers, out of order), its key
    tells that request apart as already learned."""
    out: list[TranscriptMessage] = []
    open_turn = _open_user_turn(messages) if conversation is not None else None
    new_message: TranscriptMessage | None = None
    for index, message in enumerate(messages):
        role = message.get("role")
        if role not in LEARNABLE_ROLES:
            continue
        # Cut before it is fingerprinted and buffered: a 5 MB paste costs 4000 characters
        # of queue storage, and the same paste resent still has the same fingerprint.
        text = clip_message(strip_blocks(message_text(message)).strip())
        images = message_images(message)
        if not text and not images:
            continue  # e.g. assistant tool-call turns with null content
        name = message.get("name") if isinstance(message.get("name"), str) else None
        seed = fingerprint_seed(tenant=tenant, user=user, role=str(role), text=text,
                                images=images)
        out.append(TranscriptMessage(role=str(role), text=text, name=name, images=images,
                                     fingerprint=keys(seed), aliases=keys.aliases(seed)))
        if index == open_turn:
            new_message = out[-1]
    if conversation is not None:
        requests = request_keys(tenant=tenant, user=user, conversation=conversation,
                                fingerprints=[m.fingerprint for m in out])
        out = [replace(m, request=key, new=m is new_message) if m.role == "user" else m
               for m, key in zip(out, requests, strict=True)]
    out = out[-limit:]
    reply_text = clip_message(strip_blocks(reply).strip())
    if reply_text:
        seed = fingerprint_seed(tenant=tenant, user=user, role="assistant", text=reply_text)
        out.append(TranscriptMessage(role="assistant", text=reply_text,
                                     fingerprint=keys(seed), aliases=keys.aliases(seed)))
    return tuple(out)
