"""JSON responses rendered with orjson."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response


def json_response(
    data: Any, *, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(data), status_code=status_code,
                    media_type="application/json", headers=dict(headers or {}))
