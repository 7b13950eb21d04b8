"""Which tenant an admin route acts on — one rule for every ``/v1/admin/*`` route
(docs/design.md#admin-scope).

- A tenant admin key (``auth.admin_keys``) acts on its own tenant only: a ``?tenant=``
  naming another tenant (the reserved global namespace included) is 403 ``other_tenant``
  on every route, never ignored.
- A global admin key (``auth.global_admin_keys``) carries no tenant. It reads one tenant's
  ``stats`` and ``usage`` by naming it (``?tenant=``; 400 ``missing_tenant`` without it),
  manages system memories (``/v1/admin/memories``, where ``?tenant=`` is 403: shared
  memories belong to the tenant's admin key), and is refused (403
  ``tenant_admin_required``) everywhere else a tenant is required — prompts, dead letters,
  the audit log, users, settings — so it never reaches a tenant's data there nor the
  global namespace's own prompts and dead letters.

``tests/routes/test_admin_scope.py`` holds a table of every admin route under both rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request

from proxy.errors import InvalidRequestError, PermissionDeniedError
from proxy.resources import Resources
from proxy.routes.params import check_query
from proxy.settings import GLOBAL_NAMESPACE

# What a global admin key may do on a route: nothing (the default), read one named tenant,
# or work in the global (system memory) namespace.
GlobalUse = Literal["refused", "reads_tenant", "system"]


@dataclass(frozen=True, slots=True)
class Admin:
    """The caller of an admin route: resources, the tenant acted on, the key's name."""

    res: Resources
    tenant: str
    actor: str
    is_global: bool


def caller(request: Request, *, global_use: GlobalUse = "refused") -> Admin:
    """Authenticate an admin and pick the tenant (module docstring). Raises 401 for a
    missing or unknown key, 403 (``other_tenant``, ``tenant_admin_required``) and 400
    (``missing_tenant``, ``param`` ``tenant``) as the module docstring says, and 400 for a
    query parameter given twice or holding a control character
    (:func:`~proxy.routes.params.check_query`: ``tenant=a&tenant=b`` names no tenant)."""
    res: Resources = request.app.state.resources
    principal = res.keyring.authenticate_admin(request.headers)
    check_query(request.query_params)
    asked = request.query_params.get("tenant") or None
    actor = principal.key_name or "admin"
    if not principal.is_global_admin:
        if asked is not None and asked != principal.tenant:
            raise PermissionDeniedError("An admin key acts on its own tenant only.",
                                        param="tenant", code="other_tenant")
        return Admin(res, principal.tenant, actor, False)
    if global_use == "system":
        if asked is not None:
            raise PermissionDeniedError(
                "A global admin key manages system memories; a tenant's shared memories "
                "belong to that tenant's admin key.", param="tenant",
                code="tenant_admin_required")
        return Admin(res, GLOBAL_NAMESPACE, actor, True)
    if global_use != "reads_tenant":
        raise PermissionDeniedError(
            "A global admin key manages system memories and reads a tenant's stats "
            "and usage (?tenant=); use the tenant's admin key here.",
            code="tenant_admin_required")
    if asked is None or asked == GLOBAL_NAMESPACE:
        raise InvalidRequestError("A global admin key names the tenant: add "
                                  "?tenant=<name>.", param="tenant", code="missing_tenant")
    return Admin(res, asked, actor, True)
