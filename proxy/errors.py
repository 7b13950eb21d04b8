"""One error tree, rendered in OpenAI's error envelope.

::

    MemoryProxyError                (base of every error the gateway raises itself)
    ├── StoreUnavailableError       503 store_unavailable     (memory/store.py)
    ├── ParseError, LearningWindowTooSmall, BudgetSpent      (learning: never a reply)
    ├── EmbedderError, ConfigError, IndexMismatchError, ClientDisconnectedError
    └── ProxyError                  500 server_error          (reported to a client)
        ├── InvalidRequestError     400 invalid_request_error
        │   └── ContextLengthExceededError  400 code=context_length_exceeded
        ├── AuthenticationError     401 authentication_error  code=invalid_api_key
        ├── PermissionDeniedError   403 permission_error
        ├── NotFoundError           404 not_found_error       (models, memories)
        ├── ConflictError           409 conflict_error
        └── UpstreamError           status of the upstream (default 502)
            ├── UpstreamTimeoutError 504 timeout (408 when the upstream itself answered 408)
            ├── RateLimitError      429 rate_limit_error      (+ Retry-After)
            └── UpstreamUnavailableError 502 upstream_unavailable (connection failed)

Routes raise; the app's one handler of :class:`MemoryProxyError` answers with the error's
:meth:`~MemoryProxyError.reply` (a :class:`ProxyError` replies as itself, a store outage as
a 503; an error without a reply is answered as an unexpected failure, 500);
:func:`error_body` renders ``{"error": {"message", "type", "param", "code"}}`` with the
status and headers, and a stream that already started ends with :func:`error_event`
instead. Foreign exceptions are translated at the boundary (``upstream/``) with
``raise X(...) from exc``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import orjson
from pydantic import ValidationError


class MemoryProxyError(Exception):
    """Base of every error the gateway raises itself (foreign exceptions are translated to
    one of these at the boundary).

    ``log_traceback``: a learning job failing with this error is logged with its traceback
    (a failure the message does not explain); the errors the worker expects — upstream
    failures, unparseable model output, store outages, a too-small learning window — log
    the message only. ``log_event``: the warning event logged when a request fails with an
    error whose :meth:`reply` is not itself."""

    log_traceback: ClassVar[bool] = False
    log_event: ClassVar[str] = "request_failed"

    def reply(self) -> ProxyError | None:
        """The error a client is answered with; ``None`` (the default): none of its own,
        the request is answered as an unexpected failure (500, logged with its traceback)."""
        return None


class ProxyError(MemoryProxyError):
    """Base of every error the gateway reports to a client."""

    status_code: int = 500
    error_type: str = "server_error"
    default_code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        status_code: int | None = None,
        error_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = param
        if status_code is not None:
            self.status_code = status_code
        if error_type is not None:
            self.error_type = error_type
        self.headers: dict[str, str] = dict(headers or {})

    def reply(self) -> ProxyError:
        """Itself: the error is the reply."""
        return self

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI error envelope as a dict."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequestError(ProxyError):
    status_code = 400
    error_type = "invalid_request_error"


def decode_json(raw: bytes, expected: str) -> Any:
    """``raw`` decoded as JSON, ``None`` when empty. Raises :class:`InvalidRequestError`
    (400 ``invalid_json``) saying what the decoder found and where — ``depth limit
    exceeded`` for nesting past its 1,024 levels alike — then what to send
    (``expected``, a sentence). The one reading of a request body as JSON, so every
    route words a bad body alike."""
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"The request body is not valid JSON ({exc.msg} at position {exc.pos}). "
            f"{expected}", code="invalid_json") from exc


def error_path(error: Mapping[str, Any], data: Any) -> tuple[str | int, ...]:
    """Where a pydantic ``error`` lies in the validated ``data``: its ``loc`` without the
    parts that are not positions in the input — the member tag of a union
    (``('learning.batch_messages', 'int')`` for the ``int`` member of ``int | dict``), and
    the ``[key]`` marker of a mapping key — found by walking ``loc`` through ``data``.
    The last part of a ``missing`` error is kept (the absent field)."""
    path: list[str | int] = []
    node = data
    loc: Sequence[str | int] = error.get("loc", ())
    for index, part in enumerate(loc):
        keyed = isinstance(node, Mapping) and isinstance(part, str) and part in node
        indexed = (isinstance(node, list | tuple) and isinstance(part, int)
                   and not isinstance(part, bool) and -len(node) <= part < len(node))
        if keyed or indexed:
            node = node[part]
        elif index == len(loc) - 1 and error.get("type") == "missing":
            node = None
        else:
            continue
        path.append(part)
    return tuple(path)


def invalid_value(exc: ValidationError, data: Any, *, prefix: str = "") -> InvalidRequestError:
    """The first problem of ``exc`` (raised validating ``data``) as a 400 whose ``param``
    is the dotted path of the bad value (``tags.0``, ``learning.batch_messages.private``;
    ``prefix`` + ``.`` in front when given), ``code`` ``invalid_value``.

    Among the errors of the first field, the deepest path wins (a union reports the member
    that got furthest), and the messages of the errors at that path are joined (``Input
    should be a valid integer or Input should be a valid dictionary``)."""
    errors = exc.errors()
    if not errors:
        return InvalidRequestError(str(exc), code="invalid_value", param=prefix or None)
    paths = [(error_path(error, data), error) for error in errors]
    head = paths[0][0][:1]
    group = [(path, error) for path, error in paths if path[:1] == head]
    path = max((p for p, _ in group), key=len)
    messages = dict.fromkeys(str(error["msg"]) for p, error in group if p == path)
    dotted = ".".join(str(part) for part in path)
    param = ".".join(part for part in (prefix, dotted) if part) or None
    message = " or ".join(messages)
    return InvalidRequestError(f"{param}: {message}" if param else message, param=param,
                               code="invalid_value")


class ContextLengthExceededError(InvalidRequestError):
    default_code = "context_length_exceeded"


class AuthenticationError(ProxyError):
    status_code = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(ProxyError):
    status_code = 403
    error_type = "permission_error"


class NotFoundError(ProxyError):
    status_code = 404
    error_type = "not_found_error"


class ConflictError(ProxyError):
    status_code = 409
    error_type = "conflict_error"


class UpstreamError(ProxyError):
    """The upstream model API failed; ``status_code`` is the upstream's status."""

    status_code = 502
    error_type = "upstream_error"


class UpstreamTimeoutError(UpstreamError):
    status_code = 504
    error_type = "timeout"
    default_code = "timeout"


class RateLimitError(UpstreamError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait, from the upstream's Retry-After header, when it sent one."""
        value = self.headers.get("Retry-After") or self.headers.get("retry-after")
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None


class UpstreamUnavailableError(UpstreamError):
    status_code = 502
    error_type = "upstream_unavailable"


_BY_STATUS: dict[int, type[ProxyError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: UpstreamTimeoutError,
    409: ConflictError,
    429: RateLimitError,
}

_CONTEXT_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
_CONTEXT_PHRASES = (
    "maximum context length",
    "context length",
    "context_length_exceeded",
    "too many tokens",
    "prompt is too long",
    "input is too long",
)


def upstream_error_from_body(
    status: int, body: Any, *, headers: Mapping[str, str] | None = None
) -> ProxyError:
    """Translate an upstream error response (status + parsed JSON body) to our tree.

    ``body`` may be an OpenAI envelope, a bare error object, a string, or anything else;
    the upstream's message, type and code are kept, and its status is kept as ours.
    """
    message, err_type, code, param = _fields(body)
    if not message:
        message = f"upstream returned HTTP {status}"
    kept = {k: v for k, v in (headers or {}).items() if k.lower() == "retry-after"}
    if is_context_overflow(message, code):
        return ContextLengthExceededError(message, param=param, headers=kept, code=code or None)
    cls = _BY_STATUS.get(status, UpstreamError)
    return cls(message, code=code, param=param, status_code=status,
               error_type=err_type or None, headers=kept)


def is_context_overflow(message: str, code: str | None) -> bool:
    """True when an upstream error says the prompt does not fit the context window."""
    if code in _CONTEXT_CODES:
        return True
    lowered = message.lower()
    return any(phrase in lowered for phrase in _CONTEXT_PHRASES)


def status_for_stream_error(body: Any) -> int:
    """Status to report for an error object that arrived inside an SSE stream.

    Before the first content it becomes an HTTP error with this status
    (docs/design.md#streaming)."""
    message, err_type, code, _ = _fields(body)
    if is_context_overflow(message, code):
        return 400
    raw = body.get("error") if isinstance(body, dict) else None
    if isinstance(raw, dict):
        for key in ("status", "status_code", "code"):
            value = raw.get(key)
            if isinstance(value, int) and 400 <= value <= 599:
                return value
    by_type = {
        "invalid_request_error": 400,
        "authentication_error": 401,
        "permission_error": 403,
        "not_found_error": 404,
        "rate_limit_error": 429,
        "timeout": 408,
    }
    return by_type.get(err_type or "", 502)


def _fields(body: Any) -> tuple[str, str | None, str | None, str | None]:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, str):
            return inner, None, None, None
        if isinstance(inner, dict):
            code = inner.get("code")
            return (
                str(inner.get("message") or body.get("message") or ""),
                _opt_str(inner.get("type")),
                None if code is None else str(code),
                _opt_str(inner.get("param")),
            )
    if isinstance(body, str):
        return body[:2000], None, None, None
    return "", None, None, None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def error_body(error: ProxyError) -> bytes:
    """JSON bytes of the envelope."""
    return orjson.dumps(error.to_dict())


def error_event(error: ProxyError) -> bytes:
    """A final SSE event carrying the error, for failures after the stream started."""
    return b"data: " + orjson.dumps(error.to_dict()) + b"\n\n"
