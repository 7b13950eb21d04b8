"""Derived conversation ids that keep chats apart (docs/design.md#identity; README
"Conversations without an id").

When the client names no conversation (no ``X-Conversation-Id``, no
``metadata.conversation_id``, no group), a chat is identified by what the user said so far:
a chain of message hashes, ``H_k = BLAKE2b(H_{k-1}, text of user message k)``, seeded with
(tenant, user, channel, group). Assistant messages are left out of the chain: clients
store and resend replies in their own ways (trimmed, re-rendered, cut by a tool call), and
a chain through them would split one chat at every such change. Each request records its
node ``H_m`` → the conversation id. A later request continues the conversation of the
newest recorded node its user messages pass through:

- the same user messages again (a retry, a regenerated reply) stay in it;
- the node's first continuation claims it (the next turn of the same chat);
- a *different* continuation is another chat that shared the opening (the same greeting):
  it forks, with an id derived from its own history, so two chats that diverge after the
  same first turn never share a learning transcript.

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

# Recorded requests kept (about 150 bytes each: ~15 MB at the cap); the least recently
# used go first — a chat idle long enough to lose its node is split, never merged.
MAX_NODES = 100_000


@dataclass(slots=True)
class _Node:
    conversation: str
    continuation: bytes | None = None  # chain hash of the first user message that followed


def _seed(identity: Identity) -> bytes:
    text = "\x1f".join((identity.tenant, identity.user or "", identity.channel,
                        identity.group or ""))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def chain(identity: Identity, messages: list[Message]) -> list[bytes]:
    """``H_1 … H_m`` over the user messages of ``messages`` that hold text or images (their
    text, whitespace-trimmed; an image-only message hashes as empty text)."""
    out: list[bytes] = []
    current = _seed(identity)
    for message in messages:
        if message.get("role") != "user":
            continue
        current = hashlib.blake2b(current + message_text(message).strip().encode(),
                                  digest_size=16).digest()
        out.append(current)
    return out


class ConversationChains:
    """The in-process map of recorded requests (see the module docstring)."""

    def __init__(self, max_nodes: int = MAX_NODES) -> None:
        self._nodes: OrderedDict[bytes, _Node] = OrderedDict()
        self._max = max_nodes

    def resolve(self, identity: Identity, messages: list[Message]) -> str:
        """The conversation id of a request whose identity was derived; records it."""
        hashes = chain(identity, messages)
        conversation = self._find(identity, messages, hashes)
        if hashes and hashes[-1] not in self._nodes:
            self._nodes[hashes[-1]] = _Node(conversation)
            while len(self._nodes) > self._max:
                self._nodes.popitem(last=False)
        return conversation

    def _find(self, identity: Identity, messages: list[Message], hashes: list[bytes]) -> str:
        for index in range(len(hashes) - 1, -1, -1):
            node = self._nodes.get(hashes[index])
            if node is None:
                continue
            self._nodes.move_to_end(hashes[index])
            if index == len(hashes) - 1:
                return node.conversation  # the same user messages: a retry or regeneration
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


def _fork_id(chain_hash: bytes) -> str:
    return "conv_" + chain_hash.hex()[:32]
