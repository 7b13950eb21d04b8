"""Per-model capabilities computed at startup (proxy/models.py)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.models import ModelMap, build_route
from proxy.settings import Deployment

MAP = ModelMap(entries={}, providers=frozenset({"openai", "azure", "anthropic",
                                                "hosted_vllm"}))


def route(model: str, **params: Any) -> Any:
    info = params.pop("model_info", {})
    deployment = Deployment.model_validate({
        "model_name": "m", "model_info": info,
        "litellm_params": {"model": model, "api_key": "os.environ/NONE_SET", **params}})
    return build_route(deployment, MAP, default_window=8000, force_litellm=False)


@pytest.mark.parametrize(("model", "params", "native"), [
    ("openai/gpt-4o-mini", {}, True),  # OpenAI's own API
    ("openai/gpt-4o-mini", {"api_base": "https://api.openai.com/v1"}, True),
    ("openai/m", {"api_base": "http://localhost:8000/v1"}, False),  # an OpenAI-compatible server
    ("azure/my-deployment", {"api_base": "https://x.openai.azure.com"}, True),
    ("anthropic/claude-3-5-sonnet-latest", {}, False),
    ("hosted_vllm/m", {"api_base": "http://vllm:8000/v1"}, False),
    ("openai/m", {"api_base": "http://localhost:8000/v1",
                  "model_info": {"supports_responses_api": True}}, True),
    ("openai/gpt-4o-mini", {"model_info": {"supports_responses_api": False}}, False),
])
def test_responses_api_support_defaults_to_openai_and_azure(model: str, params: dict[str, Any],
                                                            native: bool) -> None:
    """POST /v1/responses is relayed natively only to OpenAI's own API and Azure unless
    model_info.supports_responses_api says otherwise."""
    assert route(model, **params).supports_responses_api is native
