"""``model_list``: the upstream deployments, in LiteLLM's shape."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from proxy.settings.base import ENV_REFERENCE, resolve_env_reference


class LiteLLMParams(BaseModel):
    """``litellm_params`` of one deployment (LiteLLM's shape; unknown keys go to litellm)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str
    api_base: str | None = None
    api_key: SecretStr | None = None
    api_version: str | None = None
    organization: str | None = None
    timeout: float | None = Field(default=None, gt=0)
    extra_headers: dict[str, str] = Field(default_factory=dict)
    # The env var named by ``os.environ/NAME`` when it was unset at startup (for messages).
    missing_api_key_env: str | None = Field(default=None, exclude=True)
    # True when api_key was written out instead of ``os.environ/NAME`` (startup warns).
    literal_api_key: bool = Field(default=False, exclude=True)

    @field_validator("api_base")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"api_base must be an http:// or https:// URL with a host, got "
                             f"{value[:100]!r}")
        return value.rstrip("/")

    @model_validator(mode="before")
    @classmethod
    def _resolve_secrets(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        literal = data.get("api_key")
        if isinstance(literal, str) and literal and not literal.startswith(ENV_REFERENCE):
            data["literal_api_key"] = True
        for key in ("api_key", "api_base", "api_version", "organization"):
            raw = data.get(key)
            if isinstance(raw, str) and raw.startswith(ENV_REFERENCE):
                resolved = resolve_env_reference(raw, setting=f"litellm_params.{key}")
                if resolved is None and key == "api_key":
                    data["missing_api_key_env"] = raw.removeprefix(ENV_REFERENCE)
                data[key] = resolved
        return data


class ModelInfo(BaseModel):
    """``model_info`` of one deployment: overrides of what the model map says."""

    model_config = ConfigDict(extra="allow", frozen=True)

    max_input_tokens: int | None = Field(default=None, gt=0)
    # tiktoken encoding ("o200k_base", "cl100k_base") or "anthropic" / "deepseek".
    tokenizer: str | None = None
    supports_developer_role: bool | None = None
    supports_system_messages: bool | None = None
    # Structured output (response_format json_schema) and image input, for learning calls.
    supports_response_schema: bool | None = None
    supports_vision: bool | None = None
    # The upstream speaks OpenAI's Responses API (POST /v1/responses is relayed, not
    # translated to chat completions). Default: true for OpenAI's own API and Azure.
    supports_responses_api: bool | None = None


class Deployment(BaseModel):
    """One entry of ``model_list`` (LiteLLM shape)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_name: str = Field(min_length=1)
    litellm_params: LiteLLMParams
    model_info: ModelInfo = Field(default_factory=ModelInfo)
