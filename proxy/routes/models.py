"""``GET /v1/models``: the configured ``model_name`` values, in OpenAI's list shape."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from proxy import openapi
from proxy.resources import Resources
from proxy.routes.json import json_response
from proxy.routes.shapes import ModelList


async def list_models(request: Request) -> Response:
    res: Resources = request.app.state.resources
    res.keyring.authenticate(request.headers)
    return json_response(res.registry.list_models())


openapi.register(
    openapi.Operation("GET", "/v1/models", "The configured models", auth="key",
                      response=ModelList, tags=("models",)),
)
