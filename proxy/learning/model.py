"""Calls to the learning model, with the learning ledger kept apart from user usage.

The learning model is ``learning.model`` or, when empty, the model of the request that
produced the batch (seed 000 §6 LearningModel). Calls go through the same
:class:`~proxy.upstream.base.Upstream` as chat. JSON output is requested with
``response_format``: a JSON schema where litellm's model map says the model supports
structured output, JSON mode otherwise; an upstream that rejects ``response_format`` is
asked again without it (and not asked with it again).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from proxy.errors import InvalidRequestError
from proxy.learning.parsing import ModelOutput
from proxy.ledger import LearningUsage, Ledger, Purpose
from proxy.models import ModelRegistry
from proxy.request import Message
from proxy.tokens import TokenCounter
from proxy.transcript import usage_from
from proxy.upstream.base import Upstream, UpstreamCall


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
        self._no_response_format: set[str] = set()

    def model_for(self, request_model: str) -> str:
        return self._model or request_model

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
    ) -> ModelOutput:
        """One JSON-producing call. Raises the upstream's :class:`~proxy.errors.ProxyError`
        (rate limits, timeouts, …) for the caller to retry."""
        name = self.model_for(request_model)
        route = self._registry.route(name)
        body: dict[str, Any] = {"messages": messages, "temperature": 0,
                                "max_tokens": max_tokens, "stream": False}
        if name not in self._no_response_format:
            body["response_format"] = {"type": "json_object"}
        try:
            completion = await self._upstream.complete(UpstreamCall(route=route, body=body))
        except InvalidRequestError as exc:
            said = exc.message.lower()
            if "response_format" not in body or not ("response_format" in said or "json" in said):
                raise
            self._no_response_format.add(name)
            body.pop("response_format")
            completion = await self._upstream.complete(UpstreamCall(route=route, body=body))
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
