"""The OpenAPI 3.1 document of the management API, built from the pydantic models that
validate requests and describe responses (``model_json_schema``).

Each route module declares its operations once, next to its handlers::

    openapi.register(openapi.Operation(
        "PATCH", "/v1/memories/{memory_id}", "Edit, disable or enable a memory",
        auth="user", body=MemoryPatch, response=MemoryOut, errors=(400, 404)))

:func:`document` assembles every registered operation into one document (request and
response schemas under ``components.schemas``, errors as OpenAI's envelope, auth as
security requirements); ``GET /openapi.json`` (:func:`openapi_json`) serves it without a
key. Another module adds its routes the same way — one ``register`` call per route.

``auth``: ``"none"`` (no key), ``"key"`` (any gateway or admin key), ``"user"`` (a key and
an end user: user-bound key, or ``X-User-Id``), ``"admin"`` (an admin key).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import Response

from proxy.routes.json import json_response

Auth = Literal["none", "key", "user", "admin"]
OPENAPI_VERSION = "3.1.0"
_REF = "#/components/schemas/{model}"
# HTTP status → the description of an error response (its body: the operation's error_model).
_ERRORS: dict[int, str] = {
    400: "Invalid request (the error's `param` names the offending parameter)",
    401: "Missing or unknown API key",
    403: "The key may not do this (e.g. a global admin key on an end-user or tenant route, "
         "an admin key naming another tenant)",
    404: "Not found (another user's or tenant's record is indistinguishable from none)",
    405: "Method not allowed",
    409: "Conflict with the gateway's configuration",
    413: "Request body too large",
    503: "The memory store is unavailable; retry after `Retry-After` seconds",
}


class ErrorDetail(BaseModel):
    """OpenAI's error object (:mod:`proxy.errors`)."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every error answer: ``{"error": {message, type, param, code}}``."""

    error: ErrorDetail


@dataclass(frozen=True, slots=True)
class Operation:
    """One route: ``method`` and ``path`` (Starlette syntax, ``{name}`` or
    ``{name:path}``), a one-line ``summary``, who may call it (``auth``), the ``query``
    model (each field one query parameter), the JSON ``body`` model, the ``response``
    model (``None``: ``response_media`` text, e.g. Prometheus or Markdown) with its
    ``status``, the error statuses it may answer besides the auth ones, and the model of
    its error bodies (``error_model``; default OpenAI's envelope, :class:`ErrorBody`)."""

    method: str
    path: str
    summary: str
    auth: Auth = "user"
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    errors: Sequence[int] = ()
    tags: Sequence[str] = ()
    response_media: str = "application/json"
    alternative_media: Sequence[str] = ()  # other media types the same response may take
    description: str = ""
    path_params: dict[str, str] = field(default_factory=dict)
    error_model: type[BaseModel] | None = None


_REGISTRY: dict[tuple[str, str], Operation] = {}


def register(*operations: Operation) -> None:
    """Add operations to the document (a later registration of the same method and path
    replaces the earlier one)."""
    for op in operations:
        _REGISTRY[(op.method.upper(), op.path)] = op


def registered() -> list[Operation]:
    return list(_REGISTRY.values())


def _openapi_path(path: str) -> tuple[str, list[str]]:
    names = re.findall(r"{(\w+)(?::\w+)?}", path)
    return re.sub(r"{(\w+)(?::\w+)?}", r"{\1}", path), names


def _query_parameters(model: type[BaseModel], defs: dict[str, Any]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template=_REF)
    defs.update(schema.pop("$defs", {}))
    required = set(schema.get("required", []))
    params = []
    for name, prop in schema.get("properties", {}).items():
        description = prop.pop("description", None)
        param: dict[str, Any] = {"name": name, "in": "query", "required": name in required,
                                 "schema": prop}
        if description:
            param["description"] = description
        params.append(param)
    return params


def document(operations: Sequence[Operation] | None = None, *,
             title: str = "memory-proxy management API",
             version: str = "1", user_header: str = "X-User-Id") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations`` (default: every registered one)."""
    ops = list(operations if operations is not None else _REGISTRY.values())
    models: dict[str, type[BaseModel]] = {"ErrorBody": ErrorBody}
    for op in ops:
        for model in (op.query, op.body, op.response, op.error_model):
            if model is not None and model is not op.query:
                models[model.__name__] = model
    _, top = models_json_schema([(m, "validation") for m in models.values()],
                                ref_template=_REF)
    schemas: dict[str, Any] = dict(top.get("$defs", {}))
    paths: dict[str, dict[str, Any]] = {}
    for op in sorted(ops, key=lambda o: (o.path, o.method)):
        path, names = _openapi_path(op.path)
        parameters = _parameters(op, names, schemas, user_header)
        entry: dict[str, Any] = {
            "summary": op.summary,
            "operationId": f"{op.method.lower()}_{re.sub(r'[^a-z0-9]+', '_', path.lower())}"
                           .rstrip("_"),
            "responses": _responses(op),
        }
        if op.description:
            entry["description"] = op.description
        if op.tags:
            entry["tags"] = list(op.tags)
        if parameters:
            entry["parameters"] = parameters
        if op.body is not None:
            entry["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": _REF.format(model=op.body.__name__)}}}}
        entry["security"] = [] if op.auth == "none" else \
            [{"adminKey": []}] if op.auth == "admin" else [{"gatewayKey": []}]
        paths.setdefault(path, {})[op.method.lower()] = entry
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": title, "version": version,
                 "description": "Long-term memory of your users behind an OpenAI-compatible "
                                "gateway. Errors use OpenAI's envelope (Anthropic's "
                                "under /v1/messages)."},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "gatewayKey": {"type": "http", "scheme": "bearer",
                               "description": "A gateway key (auth.keys) or an admin key"},
                "adminKey": {"type": "http", "scheme": "bearer",
                             "description": "An admin key (auth.admin_keys); where a "
                                            "route says so, a global admin key "
                                            "(auth.global_admin_keys)"},
            },
        },
    }


def _parameters(op: Operation, names: list[str], schemas: dict[str, Any],
                user_header: str) -> list[dict[str, Any]]:
    """The path parameters ``names``, the user header (``auth="user"``) and the query
    parameters of ``op``, in that order; the query model's ``$defs`` go to ``schemas``."""
    parameters: list[dict[str, Any]] = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"},
         **({"description": op.path_params[n]} if n in op.path_params else {})}
        for n in names
    ]
    if op.auth == "user":
        parameters.append({
            "name": user_header, "in": "header", "required": False,
            "schema": {"type": "string", "minLength": 1, "maxLength": 256},
            "description": "The end user (ignored for a user-bound key; an admin key "
                           "acts for this user of its tenant)",
        })
    if op.query is not None:
        parameters += _query_parameters(op.query, schemas)
    return parameters


def _responses(op: Operation) -> dict[str, Any]:
    """``op``'s success response and its error responses: the declared ``errors``, plus
    400, 401, 403 and 503 for every keyed route (403: a global admin key is refused on
    end-user routes, a key may not do what an admin route does), 413 with a body."""
    content_schema: dict[str, Any] = (
        {"$ref": _REF.format(model=op.response.__name__)}
        if op.response is not None else {"type": "string"})
    media = {op.response_media: {"schema": content_schema}}
    for other in op.alternative_media:
        media[other] = {"schema": {"type": "string"}}
    responses: dict[str, Any] = {
        str(op.status): {"description": op.summary, "content": media}}
    statuses = set(op.errors) | {400, 503} if op.auth != "none" else set(op.errors)
    if op.auth != "none":
        statuses |= {401, 403}
    if op.body is not None:
        statuses |= {413}
    error_model = (op.error_model or ErrorBody).__name__
    for status in sorted(statuses):
        responses[str(status)] = {
            "description": _ERRORS.get(status, "Error"),
            "content": {"application/json": {
                "schema": {"$ref": _REF.format(model=error_model)}}},
        }
    return responses


async def openapi_json(request: Request) -> Response:
    """``GET /openapi.json``: the document, no key needed."""
    res = request.app.state.resources
    return json_response(document(user_header=res.settings.identity.user_header))
