"""Whose memory a management request acts on, and the helpers every user route shares.

The end user is identified exactly as for chat (:func:`proxy.identity.resolve_user`): a
user-bound key, else the user header, else ``user`` in the body or query string. An admin
key may act for a user of its own tenant (``X-User-Id``); its changes are audited with
actor ``admin``. The tenant always comes from the key, so no request reaches another
tenant.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from starlette.requests import Request

from proxy.auth import Principal
from proxy.errors import InvalidRequestError
from proxy.identity import resolve_user
from proxy.learning.policy import Switches
from proxy.memory.store import AuditEvent, UserSettings
from proxy.resources import Resources
from proxy.routes.params import check_query

Actor = Literal["user", "admin"]


@dataclass(frozen=True, slots=True)
class Owner:
    """The (tenant, user) a request acts on and who acts (``user`` or ``admin``)."""

    tenant: str
    user: str
    actor: Actor
    principal: Principal

    def audit(self, res: Resources, action: str, memory_id: str | None = None, *,
              reason: str = "", detail: dict[str, object] | None = None) -> AuditEvent:
        return AuditEvent(tenant=self.tenant, user_id=self.user,
                          action=action,  # type: ignore[arg-type]
                          actor=self.actor, at=res.clock(), memory_id=memory_id,
                          reason=reason, detail=detail or {})


def caller(request: Request, res: Resources, source: dict[str, Any]) -> tuple[Principal,
                                                                             str | None]:
    """The authenticated key and the end user it names (``None``: none named)."""
    principal = res.keyring.authenticate(request.headers)
    user, _ = resolve_user(principal, request.headers, source, res.settings.identity)
    return principal, user


# Where a route reads the body-or-query ``user`` from, as its missing-user message says.
Reads = Literal["query", "body", "both"]
_READS: dict[str, str] = {"query": "the query string", "body": "the JSON body",
                          "both": "the JSON body or the query string"}


def owner(request: Request, res: Resources, source: dict[str, Any], *,
          reads: Reads = "both") -> Owner:
    """The caller's (tenant, user); ``source`` holds the ``user`` the route reads, from
    where ``reads`` says (the missing-user message names only that place). Raises
    :class:`InvalidRequestError` (400 ``missing_user``) when no user is named,
    :class:`~proxy.errors.AuthenticationError` (401) for a missing or unknown key, and
    :class:`InvalidRequestError` (400) for a query parameter given twice or holding a
    control character (:func:`~proxy.routes.params.check_query`: ``user=a&user=b`` names
    nobody)."""
    principal, user = caller(request, res, source)
    check_query(request.query_params)
    if user is None:
        unread = "" if reads != "body" or "user" not in request.query_params else (
            "; 'user' in the query string is not read by this route")
        raise InvalidRequestError(
            f"Identify the end user: send header {res.settings.identity.user_header} "
            f"(or 'user' in {_READS[reads]}){unread}.",
            param=res.settings.identity.user_header, code="missing_user",
        )
    return Owner(principal.tenant, user, "admin" if principal.is_admin else "user",
                 principal)


async def learning_state(res: Resources, tenant: str | None,
                         settings: UserSettings | None) -> dict[str, Any]:
    """``{"global", "personal", "effective"}``: whether learning runs for the tenant
    (``learning.enabled`` in config and the tenant's run-time override; ``tenant`` None: the
    config alone), the user's switch (``None`` without a user) and whether this user's
    chats are learned from."""
    switches = Switches(config=res.learning_enabled)
    if switches.tenant_learns and tenant is not None:
        switches = replace(switches, tenant=(await res.tenants.get(tenant)).learning.enabled)
    personal = None if settings is None else settings.enable_personal_learning
    return {"global": switches.tenant_learns, "personal": personal,
            "effective": replace(switches, user=personal is not False).learns()}
