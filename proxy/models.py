"""Model routing: ``model_list`` (LiteLLM shape) → a :class:`Route` per request.

Everything per model is computed once at startup: provider, whether the upstream speaks
OpenAI's API (then it is relayed byte for byte; otherwise litellm translates), the context
window (``model_info.max_input_tokens``, else litellm's bundled model map, else
``memory.default_context_window``), the tokenizer and which instruction roles it accepts.
Several deployments under one ``model_name`` are used in turn (round robin).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import NotFoundError
from proxy.settings import Deployment, Settings
from proxy.tokens import litellm_package_dir, tokenizer_for

OPENAI_API_BASE = "https://api.openai.com/v1"
# Providers whose chat endpoint is OpenAI's own wire format at ``{api_base}/chat/completions``.
RELAY_PROVIDERS = frozenset({
    "openai", "custom_openai", "hosted_vllm", "lm_studio", "llamafile", "openai_like",
})
# Prefixes litellm accepts that are not in its model map's provider column.
_EXTRA_PROVIDERS = frozenset({
    "custom_openai", "hosted_vllm", "lm_studio", "llamafile", "openai_like", "openrouter",
    "ollama_chat", "azure", "azure_ai", "huggingface", "text-completion-openai", "vllm",
    "litellm_proxy", "github", "nvidia_nim", "cohere_chat", "vertex_ai", "gemini", "bedrock",
})


@dataclass(frozen=True, slots=True)
class ModelMap:
    """litellm's bundled ``model_prices_and_context_window_backup.json``, read directly."""

    entries: dict[str, dict[str, Any]]
    providers: frozenset[str]

    @classmethod
    def load(cls) -> ModelMap:
        package = litellm_package_dir()
        path = package / "model_prices_and_context_window_backup.json" if package else None
        entries: dict[str, dict[str, Any]] = {}
        if path is not None and path.is_file():
            raw = orjson.loads(path.read_bytes())
            entries = {k: v for k, v in raw.items() if isinstance(v, dict)}
        providers = {
            str(v["litellm_provider"]) for v in entries.values() if v.get("litellm_provider")
        }
        return cls(entries=entries, providers=frozenset(providers | _EXTRA_PROVIDERS))

    def lookup(self, model: str, provider: str | None) -> dict[str, Any]:
        bare = model.split("/", 1)[1] if provider and model.startswith(provider + "/") else model
        for key in (model, bare, f"{provider}/{bare}" if provider else None):
            if key and key in self.entries:
                return self.entries[key]
        return {}


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes and what the target model can take."""

    model_name: str
    deployment: Deployment
    provider: str | None
    litellm_model: str  # model string for litellm (with provider prefix)
    upstream_model: str  # model id sent in the body when relaying
    relay: bool
    api_base: str | None
    context_window: int
    tokenizer: str
    supports_developer_role: bool
    supports_system_messages: bool
    supports_response_schema: bool = False
    supports_vision: bool = False
    supports_responses_api: bool = False

    @property
    def timeout(self) -> float | None:
        return self.deployment.litellm_params.timeout


def split_provider(model: str, providers: frozenset[str]) -> tuple[str | None, str]:
    """``"openai/gpt-4o"`` → (``"openai"``, ``"gpt-4o"``); unknown prefixes stay in the name."""
    prefix, sep, rest = model.partition("/")
    if sep and prefix in providers:
        return prefix, rest
    return None, model


def build_route(
    deployment: Deployment, model_map: ModelMap, *, default_window: int, force_litellm: bool
) -> Route:
    params = deployment.litellm_params
    provider, bare = split_provider(params.model, model_map.providers)
    info = model_map.lookup(params.model, provider)
    if provider is None:
        provider = str(info["litellm_provider"]) if info.get("litellm_provider") else None
    relay = not force_litellm and (
        provider in RELAY_PROVIDERS or (provider is None and params.api_base is not None)
    )
    api_base = params.api_base or (OPENAI_API_BASE if provider == "openai" else None)
    if relay and api_base is None:
        relay = False  # nowhere to relay to: let litellm resolve the provider's endpoint
    overrides = deployment.model_info
    window = overrides.max_input_tokens or info.get("max_input_tokens") or default_window
    official_openai = provider == "openai" and (api_base or "").startswith(OPENAI_API_BASE)
    developer = overrides.supports_developer_role
    if developer is None:
        developer = official_openai or provider == "azure"
    system = overrides.supports_system_messages
    if system is None:
        system = info.get("supports_system_messages") is not False
    schema = overrides.supports_response_schema
    if schema is None:
        schema = bool(info.get("supports_response_schema"))
    vision = overrides.supports_vision
    if vision is None:
        vision = bool(info.get("supports_vision"))
    responses = overrides.supports_responses_api
    if responses is None:
        responses = official_openai or provider == "azure"
    return Route(
        model_name=deployment.model_name,
        deployment=deployment,
        provider=provider,
        litellm_model=params.model,
        upstream_model=bare,
        relay=relay,
        api_base=api_base.rstrip("/") if api_base else None,
        context_window=int(window),
        tokenizer=overrides.tokenizer or tokenizer_for(bare, provider),
        supports_developer_role=bool(developer),
        supports_system_messages=bool(system),
        supports_response_schema=schema,
        supports_vision=vision,
        supports_responses_api=responses,
    )


class ModelRegistry:
    """Routes by ``model_name``; ``GET /v1/models`` lists the configured names."""

    def __init__(self, settings: Settings, model_map: ModelMap | None = None) -> None:
        # The map (litellm's whole model list) is needed only to build the routes: not
        # kept, so its ~10 MB of dicts are freed after startup.
        model_map = model_map or ModelMap.load()
        force = settings.upstream.transport == "litellm"
        self._routes: dict[str, list[Route]] = {}
        for deployment in settings.model_list:
            route = build_route(deployment, model_map,
                                default_window=settings.memory.default_context_window,
                                force_litellm=force)
            self._routes.setdefault(deployment.model_name, []).append(route)
        self._cycles: dict[str, Iterator[Route]] = {
            name: itertools.cycle(routes) for name, routes in self._routes.items()
        }
        self._created = int(time.time())

    @property
    def names(self) -> list[str]:
        return list(self._routes)

    def routes(self, model: str) -> list[Route]:
        return list(self._routes.get(model, ()))

    def route(self, model: str) -> Route:
        """The next deployment for ``model``. Raises :class:`NotFoundError` (404,
        ``model_not_found``) for a name that is not in ``model_list``."""
        cycle = self._cycles.get(model)
        if cycle is None:
            raise NotFoundError(
                f"The model '{model}' does not exist on this gateway. Known models: "
                f"{', '.join(self._routes) or '(none: add model_list to config.yaml)'}.",
                code="model_not_found", param="model",
            )
        return next(cycle)

    def list_models(self) -> dict[str, Any]:
        """The ``GET /v1/models`` body."""
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": self._created,
                 "owned_by": routes[0].provider or "memory-proxy"}
                for name, routes in self._routes.items()
            ],
        }
