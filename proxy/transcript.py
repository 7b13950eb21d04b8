"""Reassembly of the assistant's reply from a chunk stream or a completion (pure).

Used only for the gateway's own records (the learning transcript and accounting); chunks
reach the client unchanged. Tool-call fragments are grouped the way OpenAI's clients do —
by ``index`` — except that a new non-null ``id`` at an index already in use starts a new
call, because some providers send parallel calls whole, each with ``index: 0``
(docs/design.md#streaming).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ToolCall:
    id: str | None
    name: str = ""
    arguments: str = ""


@dataclass(slots=True)
class Reply:
    """One choice of the assistant's reply."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    refusal: str = ""


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def usage_from(value: Any) -> Usage | None:
    """Parse an OpenAI ``usage`` object; ``None`` for anything else."""
    if not isinstance(value, dict):
        return None
    try:
        prompt = int(value.get("prompt_tokens") or 0)
        completion = int(value.get("completion_tokens") or 0)
        total = int(value.get("total_tokens") or prompt + completion)
    except (TypeError, ValueError):
        return None
    return Usage(prompt, completion, total)


class _ChoiceAssembler:
    def __init__(self) -> None:
        self.reply = Reply()
        self._parts: list[str] = []
        self._refusal: list[str] = []
        self._by_index: dict[int, int] = {}

    def feed(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str):
                self._parts.append(content)
            refusal = delta.get("refusal")
            if isinstance(refusal, str):
                self._refusal.append(refusal)
            for fragment in delta.get("tool_calls") or ():
                if isinstance(fragment, dict):
                    self._tool_fragment(fragment)
        if choice.get("finish_reason"):
            self.reply.finish_reason = str(choice["finish_reason"])

    def _tool_fragment(self, fragment: dict[str, Any]) -> None:
        calls = self.reply.tool_calls
        index = fragment.get("index", 0)
        call_id = fragment.get("id")
        position = self._by_index.get(index)
        if position is None or (call_id and calls[position].id and call_id != calls[position].id):
            calls.append(ToolCall(id=call_id))
            position = len(calls) - 1
            self._by_index[index] = position
        elif call_id and not calls[position].id:
            calls[position].id = call_id
        function = fragment.get("function") or {}
        if isinstance(function, dict):
            name = function.get("name")
            if isinstance(name, str) and name and not calls[position].name:
                calls[position].name = name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                calls[position].arguments += arguments

    def finish(self) -> Reply:
        self.reply.content = "".join(self._parts)
        self.reply.refusal = "".join(self._refusal)
        for call in self.reply.tool_calls:
            if not call.arguments.strip():
                call.arguments = "{}"
        return self.reply


class ReplyAssembler:
    """Feeds on ``chat.completion.chunk`` dicts; :meth:`replies` gives each choice."""

    def __init__(self) -> None:
        self._choices: dict[int, _ChoiceAssembler] = {}
        self.usage: Usage | None = None
        self.last_chunk: dict[str, Any] | None = None
        # The stream's id, created and model, from the first chunk that carries each.
        self.meta: dict[str, Any] = {}

    def feed(self, chunk: dict[str, Any]) -> None:
        self.last_chunk = chunk
        if len(self.meta) < 3:
            for name in ("id", "created", "model"):
                if name not in self.meta and chunk.get(name):
                    self.meta[name] = chunk[name]
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict):
                index = choice.get("index", 0)
                key = index if isinstance(index, int) else 0
                self._choices.setdefault(key, _ChoiceAssembler()).feed(choice)
        usage = usage_from(chunk.get("usage"))
        if usage is not None:
            self.usage = usage

    @property
    def finished(self) -> bool:
        """Choice 0 ended with a ``finish_reason``: the reply is complete."""
        first = self._choices.get(0)
        return first is not None and first.reply.finish_reason is not None

    def replies(self) -> dict[int, Reply]:
        return {index: assembler.finish() for index, assembler in sorted(self._choices.items())}


def generated_text(replies: dict[int, Reply]) -> str:
    """What the model generated across every choice — content, refusals, tool call names
    and arguments: the text ``completion_tokens`` counts when the gateway estimates it."""
    parts: list[str] = []
    for reply in replies.values():
        parts += [reply.content, reply.refusal]
        for call in reply.tool_calls:
            parts += [call.name, call.arguments]
    return "\n".join(p for p in parts if p)


def reply_from_completion(data: dict[str, Any]) -> tuple[dict[int, Reply], Usage | None]:
    """Choices and usage of a non-streaming ``chat.completion`` body."""
    replies: dict[int, Reply] = {}
    for position, choice in enumerate(data.get("choices") or ()):
        if not isinstance(choice, dict):
            continue
        message = choice.get("message") or {}
        content = message.get("content") if isinstance(message, dict) else None
        calls = []
        for call in (message.get("tool_calls") or ()) if isinstance(message, dict) else ():
            if isinstance(call, dict):
                function = call.get("function") or {}
                arguments = function.get("arguments") or ""
                calls.append(ToolCall(call.get("id"), function.get("name") or "",
                                      arguments if arguments.strip() else "{}"))
        index = choice.get("index", position)
        replies[index if isinstance(index, int) else position] = Reply(
            content=content if isinstance(content, str) else "",
            tool_calls=calls,
            finish_reason=choice.get("finish_reason"),
            refusal=str(message.get("refusal") or "") if isinstance(message, dict) else "",
        )
    return replies, usage_from(data.get("usage"))
