"""``learning``: the learning worker — switch, model, batching, limits, retries, PII
scrubbing and the per-tenant token budget."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator

from proxy.settings.base import ENV_REFERENCE, Section, resolve_env_reference

# A fingerprint key shorter than this is refused: 16 characters of a random secret are
# ~96 bits, past guessing (docs/design.md#erasure).
MIN_FINGERPRINT_KEY_CHARS = 16


class TenantPii(Section):
    kinds: list[str] | None = None  # None = the default kinds
    patterns: dict[str, str] = Field(default_factory=dict)  # added to the default patterns


class PiiSettings(Section):
    """PII and secret scrubbing before anything is learned. Kinds: phone, email, cn_id,
    bank_card, secret, ip; ``None`` = all. ``patterns``: extra regexes, name → pattern."""

    kinds: list[str] | None = None
    patterns: dict[str, str] = Field(default_factory=dict)
    tenants: dict[str, TenantPii] = Field(default_factory=dict)


class LearningBudget(Section):
    """``learning.budget``: learning tokens (prompt + completion of every learning call:
    score, extract, embed, vision, verdict) a tenant may spend per UTC day and per UTC calendar
    month; ``None`` = no cap. When spent, no batch is scored or extracted until the next
    period (buffered messages wait under ``buffer_ttl_seconds``, sealed jobs wait without
    using attempts); chat is untouched."""

    tokens_per_day: int | None = Field(default=None, ge=1)
    tokens_per_month: int | None = Field(default=None, ge=1)


class LearningSettings(Section):
    # The global switch of automatic learning: off unless the config turns it on.
    enabled: bool = False
    model: str = ""  # "" → the request's model
    score_threshold: float = Field(default=0.6, ge=0, le=1)
    # Consolidate every 5 private / 25 group messages (group chat is sparser in facts).
    # Sizes checked per channel, so an error names it (learning.batch_messages.private).
    batch_messages: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: {"private": 5, "group": 25}
    )
    idle_flush_seconds: int = Field(default=600, ge=1)
    buffer_ttl_seconds: int = Field(default=3 * 3600, ge=60)  # 180 minutes
    max_memory_per_user: int = Field(default=500, ge=1)
    # A year by default; at most 100 years: a date that far back is still representable, so the
    # retention sweep can never overflow (an admin override of 10^11 days once stopped it).
    retention_days: int = Field(default=365, ge=1, le=36_500)
    # A fact this similar (embeddings) to a stored memory adds evidence to it.
    dedup_similarity: float = Field(default=0.85, gt=0, le=1)
    # A new trait or topic this similar (embeddings, cosine) to a stored one is merged into
    # it after one verdict call of the learning model (docs/design.md#growing-vocabulary).
    trait_similarity: float = Field(default=0.8, gt=0, le=1)
    related_memories: int = Field(default=20, ge=0, le=200)
    max_messages_per_exchange: int = Field(default=40, ge=2, le=1000)
    scoring_prompt: str | None = None
    extraction_prompt: str | None = None
    max_output_tokens: int = Field(default=2048, ge=64)
    # Reliability: 8 attempts with a 5 s base ride out ~10 minutes of upstream
    # trouble (5+10+20+40+80+160+300 s) before a job is dead-lettered.
    max_attempts: int = Field(default=8, ge=1)
    retry_base_seconds: float = Field(default=5.0, gt=0)
    # A claimed job is redelivered to another worker when its holder has not finished it
    # within this long (a crashed worker); keep it above the slowest learning call.
    lease_seconds: int = Field(default=300, ge=5)
    poll_interval_seconds: float = Field(default=0.5, gt=0)
    seen_message_ttl_days: int = Field(default=30, ge=1)
    # The deployment secret message fingerprints are keyed with (HMAC-SHA256,
    # docs/design.md#erasure): ``os.environ/NAME`` or the value itself (e.g. from
    # MEMORY_PROXY_LEARNING__FINGERPRINT_KEY). Unset: the SQLite backend keeps a generated
    # key in a file next to the database; the Redis backend refuses to start with learning
    # on. ``fingerprint_previous_keys``: keys rotated out, still recognised, so resent
    # history is not learned twice; keep one there ``seen_message_ttl_days`` after rotating.
    fingerprint_key: SecretStr | None = None
    fingerprint_previous_keys: list[SecretStr] = Field(default_factory=list, max_length=8)
    # A controlled synonym table of trait words; the first word of a group is kept.
    synonyms: list[list[str]] = Field(
        default_factory=lambda: [["话少", "潜水", "沉默"], ["quiet", "reserved", "taciturn"]]
    )
    pii: PiiSettings = Field(default_factory=PiiSettings)
    # Maintenance (idle flush, TTL expiry) runs this often in the worker.
    maintenance_interval_seconds: float = Field(default=30.0, gt=0)
    # A cap on what learning spends per tenant (LearningBudget); none by default.
    budget: LearningBudget = Field(default_factory=LearningBudget)

    @field_validator("fingerprint_key", "fingerprint_previous_keys", mode="before")
    @classmethod
    def _keys_from_env(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [_fingerprint_key(v) for v in value]
        return None if value is None else _fingerprint_key(value)

    @field_validator("batch_messages", mode="before")
    @classmethod
    def _batch_from_int(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return {"private": value, "group": value}
        if isinstance(value, dict):
            unknown = set(value) - {"private", "group"}
            if unknown:
                raise ValueError(f"learning.batch_messages: unknown channel(s) "
                                 f"{', '.join(sorted(map(str, unknown)))}; use private, group")
            return {"private": 5, "group": 25, **value}
        return value


def _fingerprint_key(value: Any) -> Any:
    """A fingerprint key setting resolved (``os.environ/NAME``) and checked for length."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if not isinstance(value, str):
        return value
    resolved = resolve_env_reference(value, setting="learning.fingerprint_key")
    if resolved is None:
        raise ValueError(f"learning.fingerprint_key: environment variable "
                         f"{value.removeprefix(ENV_REFERENCE)} is not set")
    if len(resolved) < MIN_FINGERPRINT_KEY_CHARS:
        raise ValueError(f"learning.fingerprint_key: at least {MIN_FINGERPRINT_KEY_CHARS} "
                         "characters (a random secret, e.g. openssl rand -hex 32)")
    return resolved
