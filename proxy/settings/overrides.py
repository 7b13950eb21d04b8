"""The settings a tenant may override at run time, declared once.

Each :class:`Overridable` names a setting by its ``config.yaml`` path
(``learning.score_threshold``) and gives the JSON type ``PATCH /v1/admin/settings`` accepts
for it (strict: a boolean is ``true``/``false``, a number a JSON number; ``null`` always
removes the override). From :data:`TENANT_OVERRIDABLE` derive the tenant cache's list of
names (:data:`proxy.tenants.OVERRIDABLE`, the order of ``GET /v1/admin/settings``) and the
admin API's request model (:class:`proxy.routes.admin_models.SettingsPatch`, one field per
entry, aliased by the path). After the admin API's type check, a value is validated as at
startup by the section model the path names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


# A learning budget as JSON (``learning.budget``): tokens per UTC day and per UTC month,
# ``null`` = no cap; strict like every admin body, and the shape the stats route reports.
# (No docstring: it would become the schema's description in /openapi.json.)
class BudgetValue(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tokens_per_day: int | None = Field(default=None, ge=1)
    tokens_per_month: int | None = Field(default=None, ge=1)


# Synonym groups as JSON (``learning.synonyms``): each 2-20 words of 1-60 characters, at
# most 500 groups (the candidate list holds at most 1000 pairs; proxy/memory/synonyms.py).
SynonymWord = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                               max_length=60)]
SynonymGroups = Annotated[list[Annotated[list[SynonymWord], Field(min_length=2,
                                                                  max_length=20)]],
                          Field(max_length=500)]


@dataclass(frozen=True, slots=True)
class Overridable:
    """One run-time setting: its dotted config ``path`` (``<section>.<field>``, section
    ``learning`` or ``memory``) and the ``patch_type`` the admin API accepts for it.
    ``extends``: the tenant's value (a list) is added after ``config.yaml``'s instead of
    replacing it."""

    path: str
    patch_type: Any
    extends: bool = False

    @property
    def section(self) -> str:
        """``learning`` or ``memory``."""
        return self.path.split(".", 1)[0]

    @property
    def field(self) -> str:
        """The field of the section, e.g. ``score_threshold``."""
        return self.path.split(".", 1)[1]


TENANT_OVERRIDABLE: tuple[Overridable, ...] = (
    Overridable("learning.enabled", bool),
    Overridable("learning.score_threshold", float),
    # One size for both channels, or {"private": n, "group": m}.
    Overridable("learning.batch_messages", int | dict[str, int]),
    Overridable("learning.max_memory_per_user", int),
    Overridable("learning.retention_days", int),
    Overridable("learning.model", str),
    Overridable("learning.budget", BudgetValue),  # replaced whole; caps left out are none
    # The tenant's own synonym groups, after config.yaml's (accepted candidate synonyms
    # land here: docs/design.md#growing-vocabulary).
    Overridable("learning.synonyms", SynonymGroups, extends=True),
    Overridable("memory.injection_count", int),
    Overridable("memory.token_budget_percent", float),
    Overridable("memory.record_injections", bool),
)
"""Every setting a tenant may override, in the order the admin API lists them."""
