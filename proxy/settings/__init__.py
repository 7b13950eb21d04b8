"""Configuration: ``config.yaml`` + ``MEMORY_PROXY_*`` environment variables + defaults.

Sources, highest priority first (pydantic-settings does the merging):

1. keyword arguments to :func:`load_settings` (tests, CLI flags);
2. environment variables, prefix ``MEMORY_PROXY_``, ``__`` for nesting
   (``MEMORY_PROXY_LEARNING__ENABLED=true``; lists and mappings as JSON);
3. the YAML file named by ``--config`` / ``MEMORY_PROXY_CONFIG`` (default ``./config.yaml``
   when it exists);
4. the defaults in the section modules (the product defaults: learning off, 5 memories in
   at most 10 % of the context, batches of 5 private / 25 group messages, ...).

Secrets never live in the file: gateway keys are ``os.environ/NAME`` references or SHA-256
digests, and upstream ``api_key`` values use LiteLLM's ``os.environ/NAME`` indirection.
Invalid configuration raises :class:`ConfigError` naming the setting.
"""

from proxy.settings.alerts import AlertSettings
from proxy.settings.auth import AuthSettings, GatewayKey, JwtSettings
from proxy.settings.base import (
    ENV_PREFIX,
    ENV_REFERENCE,
    GLOBAL_NAMESPACE,
    GROUP_PREFIX,
    ID_RULE,
    MAX_ID_LENGTH,
    RESERVED_IDS_RULE,
    ConfigError,
    id_problem,
    reserved_user_id,
    resolve_env_reference,
    user_id_problem,
)
from proxy.settings.embedder import EmbedderSettings
from proxy.settings.learning import LearningBudget, LearningSettings, PiiSettings, TenantPii
from proxy.settings.memory import InjectTemplate, MemorySettings, RankingSettings
from proxy.settings.metrics import MetricsSettings
from proxy.settings.models import Deployment, LiteLLMParams, ModelInfo
from proxy.settings.overrides import TENANT_OVERRIDABLE, BudgetValue, Overridable
from proxy.settings.server import IdentitySettings, ServerSettings, UpstreamSettings
from proxy.settings.sources import DEFAULT_CONFIG_FILE, Settings, config_path, load_settings
from proxy.settings.storage import MAX_VECTOR_DIM, REDIS_URL_SCHEMES, StorageSettings

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "ENV_PREFIX",
    "ENV_REFERENCE",
    "GLOBAL_NAMESPACE",
    "GROUP_PREFIX",
    "ID_RULE",
    "MAX_ID_LENGTH",
    "MAX_VECTOR_DIM",
    "REDIS_URL_SCHEMES",
    "RESERVED_IDS_RULE",
    "TENANT_OVERRIDABLE",
    "AlertSettings",
    "AuthSettings",
    "BudgetValue",
    "ConfigError",
    "Deployment",
    "EmbedderSettings",
    "GatewayKey",
    "IdentitySettings",
    "InjectTemplate",
    "JwtSettings",
    "LearningBudget",
    "LearningSettings",
    "LiteLLMParams",
    "MemorySettings",
    "MetricsSettings",
    "ModelInfo",
    "Overridable",
    "PiiSettings",
    "RankingSettings",
    "ServerSettings",
    "Settings",
    "StorageSettings",
    "TenantPii",
    "UpstreamSettings",
    "config_path",
    "id_problem",
    "load_settings",
    "reserved_user_id",
    "resolve_env_reference",
    "user_id_problem",
]
