"""Derived conversation ids that keep chats apart (SPEC §2.2; README "Conversations").

When the client names no conversation (no ``X-Conversation-Id``, no
``metadata.conversation_id``, no group), a chat is identified by its history so far: a
chain of message hashes, ``H_k = BLAKE2b(H_{k-1}, role, text)`` over the client's user and
assistant text messages, seeded with (tenant, user, channel, group). After each reply the
gateway records the node "history + reply" → the conversation id. A later request
continues the conversation of the newest recorded node its history passes through:

- the node's first continuation claims it (the next turn of the same chat);
- the same continuation again (a retry, a regenerated reply) stays in it;
- a *different* continuation is another chat that shared the opening (the same greeting
  and the same canned reply): it forks, with an id derived from its own history, so two
  chats that diverge after the same first turn never share a learning transcript.

A request through no recorded node starts a conversation: a chat's first request keeps
the id of the earlier rule (:func:`~proxy.identity.derive_conversation_id`, over the first
user message), so ids and buffered messages from before this rule keep working; a longer
history nobody recorded (after a restart, or served by another gateway process) gets an id
from its whole history — a chat may then be split into two learning conversations, never
merged with another.

The map is in-process and bounded (:data:`MAX_NODES`, least recently used dropped first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from proxy.identity import Identity, derive_conversation_id
from proxy.request import Message, message_text

# Recorded turns kept (about 150 bytes each: ~15 MB at the cap); the least recently used
# go first — a chat idle long enough to lose its node is split, never merged.
MAX_NODES = 100_000
_ROLES = ("user", "assistant")


@dataclass(slots=True)
class _Node:
    conversation: str
    continuation: bytes | None = None  # chain hash of the first message that followed


def _seed(identity: Identity) -> bytes:
    text = "\x1f".join((identity.tenant, identity.user or "", identity.channel,
                        identity.group or ""))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _step(previous: bytes, role: str, text: str) -> bytes:
    return hashlib.blake2b(previous + role.encode() + b"\x1f" + text.encode(),
                           digest_size=16).digest()


def chain(identity: Identity, messages: list[Message]) -> list[bytes]:
    """``H_1 … H_n`` over the learnable messages (user/assistant with text) of ``messages``.
    """
    out: list[bytes] = []
    current = _seed(identity)
    for message in messages:
        role = message.get("role")
        if role not in _ROLES:
            continue
        text = message_text(message).strip()
        if not text:
            continue  # an assistant tool-call turn has no text
        current = _step(current, str(role), text)
        out.append(current)
    return out


class ConversationChains:
    """The in-process map of recorded turns (see the module docstring)."""

    def __init__(self, max_nodes: int = MAX_NODES) -> None:
        self._nodes: OrderedDict[bytes, _Node] = OrderedDict()
        self._max = max_nodes

    def resolve(self, identity: Identity, messages: list[Message]) -> str:
        """The conversation id of a request whose identity was derived."""
        hashes = chain(identity, messages)
        for index in range(len(hashes) - 2, -1, -1):
            node = self._nodes.get(hashes[index])
            if node is None:
                continue
            self._nodes.move_to_end(hashes[index])
            following = hashes[index + 1]
            if node.continuation is None:
                node.continuation = following
            if node.continuation == following:
                return node.conversation
            return _fork_id(following)
        if len(hashes) <= 1:
            return derive_conversation_id(tenant=identity.tenant, user=identity.user,
                                          channel=identity.channel, group=identity.group,
                                          messages=messages)
        return _fork_id(hashes[-1])

    def record(self, identity: Identity, messages: list[Message], reply: str) -> None:
        """After a reply: the history + reply continues ``identity.conversation``."""
        if not reply.strip():
            return
        hashes = chain(identity, messages)
        last = hashes[-1] if hashes else _seed(identity)
        node_key = _step(last, "assistant", reply.strip())
        if node_key not in self._nodes:
            self._nodes[node_key] = _Node(identity.conversation)
        self._nodes.move_to_end(node_key)
        while len(self._nodes) > self._max:
            self._nodes.popitem(last=False)


def _fork_id(chain_hash: bytes) -> str:
    return "conv_" + chain_hash.hex()[:32]
