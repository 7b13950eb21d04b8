"""The web console: static files shipped in the package (``proxy/console/``), served at
``/console/`` under a strict Content-Security-Policy.

The console is a client of the management API only (``/v1/me``, ``/v1/memories…``,
``/v1/profile``, ``/v1/settings``, ``/v1/admin/…``); it needs no server state, no build
step and nothing from another origin, so the policy allows scripts, styles and requests
from the gateway's own origin alone — no inline script or style, no framing. The API key
the user types is held by the page (``sessionStorage``) and sent as a bearer header.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

# 'self' only; data: for the empty favicon, blob: for export downloads. No 'unsafe-inline':
# the app sets bar widths through the CSSOM, which style-src does not govern.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    # Revalidate every time (ETag / Last-Modified): an upgraded gateway serves its own console.
    "Cache-Control": "no-cache",
}


class ConsoleFiles(StaticFiles):
    """``StaticFiles`` over the package's ``console`` folder (``index.html`` for the
    folder itself, ``/console`` redirected to ``/console/``), every answer carrying
    :data:`SECURITY_HEADERS`. Unknown files raise Starlette's 404, which the app renders
    in OpenAI's error shape; methods other than GET/HEAD are a 405."""

    def __init__(self) -> None:
        super().__init__(packages=[("proxy", "console")], html=True)

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response
