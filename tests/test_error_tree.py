"""One error tree: every error the gateway raises itself derives from
:class:`MemoryProxyError`; what a client is answered and whether a failed learning job logs
a traceback are attributes of the class, not lists of classes kept elsewhere."""

from __future__ import annotations

import pytest

from proxy.backends.redis.index import IndexMismatchError
from proxy.errors import MemoryProxyError, NotFoundError, ProxyError, RateLimitError
from proxy.http import ClientDisconnectedError
from proxy.learning.answers import ParseError
from proxy.learning.budget import BudgetSpent
from proxy.learning.calls import LearningWindowTooSmall
from proxy.memory.embed import EmbedderError
from proxy.memory.store import StoreUnavailableError
from proxy.settings import ConfigError

# (class, logged with a traceback when a learning job fails with it)
TREE: list[tuple[type[MemoryProxyError], bool]] = [
    (ProxyError, False), (NotFoundError, False), (RateLimitError, False),
    (StoreUnavailableError, False), (ParseError, False), (LearningWindowTooSmall, False),
    (BudgetSpent, False), (EmbedderError, True), (ConfigError, True),
    (IndexMismatchError, True), (ClientDisconnectedError, True),
]


@pytest.mark.parametrize(("cls", "traceback"), TREE, ids=[c.__name__ for c, _ in TREE])
def test_every_internal_error_is_a_memory_proxy_error(
        cls: type[MemoryProxyError], traceback: bool) -> None:
    """Each internal error class sits under the one base, with its traceback rule."""
    assert issubclass(cls, MemoryProxyError)
    assert cls.log_traceback is traceback


def test_a_proxy_error_replies_as_itself() -> None:
    """A client-facing error is its own reply."""
    error = NotFoundError("no such memory")
    assert error.reply() is error


def test_a_store_outage_replies_503_with_retry_after() -> None:
    """The store being down is answered 503 ``store_unavailable``, Retry-After 5."""
    reply = StoreUnavailableError("locked").reply()
    assert (reply.status_code, reply.error_type, reply.code) == \
        (503, "service_unavailable", "store_unavailable")
    assert reply.headers == {"Retry-After": "5"}
    assert StoreUnavailableError.log_event == "memory_store_unavailable"


@pytest.mark.parametrize("cls", [ParseError, EmbedderError, ConfigError, IndexMismatchError,
                                 ClientDisconnectedError, LearningWindowTooSmall])
def test_an_error_without_a_reply_is_answered_as_unexpected(
        cls: type[MemoryProxyError]) -> None:
    """An internal error with no reply of its own leaves the request to the 500 path."""
    assert cls("x").reply() is None
