"""Calls to the learning model, with the learning ledger kept apart from user usage.

The learning model is ``learning.model`` or, when empty, the model of the request that
produced the batch (seed 000 §6 LearningModel). Calls go through the same
:class:`~proxy.upstream.base.Upstream` as chat. JSON output is requested with
``response_format``: a JSON schema where litellm's model map says the model supports
structured output (or ``model_info.supports_response_schema`` says so); otherwise JSON mode
carrying the schema too (``{"type": "json_object", "schema": …}``, the llama.cpp /
llama-cpp-python grammar extension, which local servers turn into constrained decoding).
An upstream that refuses a format — any 4xx/5xx whose message names ``response_format``
(llama-cpp-python answers 500 to an unknown ``json_schema``) — is asked again with the next
weaker one (json_schema → json_object + schema → json_object → none), and this process
remembers what each model refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import datetime
from typing import Any

from proxy.errors import ProxyError, RateLimitError, UpstreamTimeoutError
from proxy.learning.parsing import ModelOutput
from proxy.ledger import LearningUsage, Ledger, Purpose
from proxy.models import ModelRegistry
from proxy.request import Message
from proxy.tokens import TokenCounter
from proxy.transcript import usage_from
from proxy.upstream.base import Upstream, UpstreamCall

# Share of the learning model's context window left unused by learning calls: token counts
# of models without their own tokenizer here are cl100k_base approximations.
WINDOW_MARGIN = 0.05


class LearningModel:
    def __init__(
        self,
        *,
        upstream: Upstream,
        registry: ModelRegistry,
        ledger: Ledger,
        counter: TokenCounter,
        model: str,
        clock: Callable[[], datetime],
    ) -> None:
        self._upstream = upstream
        self._registry = registry
        self._ledger = ledger
        self._counter = counter
        self._model = model
        self._clock = clock
        # model name → formats it refused ("json_schema", "json_object")
        self._refused: dict[str, set[str]] = {}

    def model_for(self, request_model: str) -> str:
        return self._model or request_model

    def with_model(self, model: str) -> LearningModel:
        """This learning model client calling ``model`` instead of the configured
        ``learning.model`` (a tenant's run-time override); it shares what each model
        refused."""
        other = copy.copy(self)
        other._model = model
        return other

    def sees_images(self, request_model: str) -> bool:
        """The learning model for this request model accepts image input (model map or
        ``model_info.supports_vision``)."""
        routes = self._registry.routes(self.model_for(request_model))
        return bool(routes) and routes[0].supports_vision

    def count(self, request_model: str, text: str) -> int:
        """Tokens of ``text`` with the learning model's tokenizer."""
        route = self._registry.route(self.model_for(request_model))
        return self._counter.count(text, route.tokenizer)

    def room(self, request_model: str, messages: list[Message], *, max_tokens: int) -> int:
        """Tokens of the learning model's context window (``Route.context_window``) left
        for the transcript once ``messages`` (the call's prompt without it) and a reply of
        ``max_tokens`` are counted, less :data:`WINDOW_MARGIN` of the window for tokenizer
        approximations (unknown models are counted with ``cl100k_base``); ≥ 0."""
        route = self._registry.route(self.model_for(request_model))
        prompt = self._counter.count_messages(messages, route.tokenizer)
        margin = int(route.context_window * WINDOW_MARGIN)
        return max(0, route.context_window - margin - prompt - max_tokens)

    async def call(
        self,
        *,
        purpose: Purpose,
        request_model: str,
        messages: list[Message],
        max_tokens: int,
        tenant: str,
        user: str,
        job_id: str | None,
        schema: dict[str, object] | None = None,
    ) -> ModelOutput:
        """One JSON-producing call. Raises the upstream's :class:`~proxy.errors.ProxyError`
        (rate limits, timeouts, …) for the caller to retry."""
        name = self.model_for(request_model)
        route = self._registry.route(name)
        refused = self._refused.setdefault(name, set())
        candidates: list[tuple[str, dict[str, Any] | None]] = []
        if schema is not None and route.supports_response_schema:
            candidates.append(("json_schema", {"type": "json_schema", "json_schema": {
                "name": purpose, "schema": schema, "strict": False}}))
        if schema is not None:
            candidates.append(("json_object+schema", {"type": "json_object", "schema": schema}))
        candidates += [("json_object", {"type": "json_object"}), ("none", None)]
        formats = [(kind, f) for kind, f in candidates if kind not in refused]
        completion = None
        for index, (kind, response_format) in enumerate(formats):
            body: dict[str, Any] = {"messages": messages, "temperature": 0,
                                    "max_tokens": max_tokens, "stream": False}
            if response_format is not None:
                body["response_format"] = response_format
            try:
                completion = await self._upstream.complete(UpstreamCall(route=route, body=body))
                break
            except ProxyError as exc:
                last = index == len(formats) - 1
                if response_format is None or last or not _refuses_format(exc):
                    raise
                refused.add(kind)
        assert completion is not None
        data = completion.data
        choice = (data.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        content = message.get("content")
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        usage = usage_from(data.get("usage"))
        if usage is None:
            prompt = self._counter.count_messages(messages, route.tokenizer)
            completion_tokens = self._counter.count(
                content if isinstance(content, str) else "", route.tokenizer
            )
        else:
            prompt, completion_tokens = usage.prompt_tokens, usage.completion_tokens
        await self._ledger.record_learning([LearningUsage(
            at=self._clock(), tenant=tenant, user_id=user, model=name, purpose=purpose,
            prompt_tokens=prompt, completion_tokens=completion_tokens, job_id=job_id,
        )])
        return ModelOutput(
            content=content if isinstance(content, str) else None,
            reasoning=reasoning if isinstance(reasoning, str) else None,
            finish_reason=choice.get("finish_reason"),
        )


def _refuses_format(error: ProxyError) -> bool:
    """The upstream rejected the request because of ``response_format`` (not a transient
    failure such as a rate limit or a timeout)."""
    if isinstance(error, RateLimitError | UpstreamTimeoutError):
        return False
    said = error.message.lower()
    return "response_format" in said or "json_schema" in said or "json_object" in said
