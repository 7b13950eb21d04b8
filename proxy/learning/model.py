"""Calls to the learning model, with the learning ledger kept apart from user usage.

The learning model is ``learning.model`` or, when empty, the model of the request that
produced the batch (docs/design.md#scoring). Calls go through the same
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
from proxy.learning.answers import ModelOutput
from proxy.learning.prompts import EXTRACTION_EN, EXTRACTION_ZH, GROUP_EN, GROUP_ZH
from proxy.ledger import LearningUsage, Ledger, Purpose
from proxy.metrics import Metrics
from proxy.models import ModelRegistry
from proxy.request import Message
from proxy.settings import ConfigError, LearningSettings
from proxy.tokens import TokenCounter
from proxy.transcript import usage_from
from proxy.upstream.base import Upstream, UpstreamCall

# Share of the learning model's context window left unused by learning calls: token counts
# of models without their own tokenizer here are cl100k_base approximations.
WINDOW_MARGIN = 0.05


# The least room a learning call must leave for the conversation: one short message line
# of the transcript ("[1] user: …", a dozen words) in cl100k_base tokens.
MIN_TRANSCRIPT_TOKENS = 64


def check_window(settings: LearningSettings, registry: ModelRegistry,
                 counter: TokenCounter) -> None:
    """Startup check: every model learning may call — ``learning.model`` when set, else
    every ``model_list`` entry (learning then uses the request's model) — must leave at
    least :data:`MIN_TRANSCRIPT_TOKENS` of its context window for the conversation once
    the largest built-in extraction prompt (Chinese, group chat, empty lists), a reply of
    ``learning.max_output_tokens`` and :data:`WINDOW_MARGIN` are counted. Raises
    :class:`~proxy.settings.ConfigError` naming the setting to change; does nothing when
    learning is off."""
    if not settings.enabled:
        return
    names = [settings.model] if settings.model else registry.names
    system = max((EXTRACTION_EN + GROUP_EN, EXTRACTION_ZH + GROUP_ZH),
                 key=lambda text: counter.count(text, "cl100k_base"))
    prompt: list[Message] = [{"role": "system", "content": system},
                             {"role": "user", "content": "已有记忆:\n\n\n新消息:\n"}]
    for name in names:
        for route in registry.routes(name):
            window = route.context_window
            used = counter.count_messages(prompt, route.tokenizer)
            room = window - int(window * WINDOW_MARGIN) - used - settings.max_output_tokens
            if room >= MIN_TRANSCRIPT_TOKENS:
                continue
            setting = "learning.model" if settings.model else \
                f"model_list ('{name}', used for learning when learning.model is empty)"
            raise ConfigError(
                f"{setting}: the model '{name}' has a context window of {window} tokens; the "
                f"learning prompt ({used} tokens) and a reply of learning.max_output_tokens "
                f"({settings.max_output_tokens}) leave {max(room, 0)} tokens for the "
                f"conversation (at least {MIN_TRANSCRIPT_TOKENS} needed). Set learning.model "
                "to a model with a larger window (model_info.max_input_tokens) or lower "
                "learning.max_output_tokens.")


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
        metrics: Metrics | None = None,
    ) -> None:
        self._upstream = upstream
        self._metrics = metrics  # learning tokens by purpose (memory_proxy_tokens_total)
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
        if self._metrics is not None:
            self._metrics.tokens.labels("learning", purpose).inc(prompt + completion_tokens)
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
