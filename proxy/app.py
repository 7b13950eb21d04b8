"""The ASGI app: routes, error rendering and the lifespan that owns every resource.

``create_app(settings)`` opens the configured backends in its lifespan; tests pass
``resources=`` (built from fakes with :func:`proxy.resources.build_resources`) and keep
ownership of them. Background tasks — the learning sink's writer, the access-count and
usage flushers, and in embedded mode the learning worker — start with the app and stop,
in reverse order, with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy import openapi
from proxy.access import AccessLogMiddleware
from proxy.alerts import alert_monitor
from proxy.auth import GATEWAY_KEY_HEADER, OPEN_TENANT
from proxy.errors import InvalidRequestError, MemoryProxyError, NotFoundError, ProxyError
from proxy.http import error_response
from proxy.memory.text import load_confusables
from proxy.resources import Resources, open_resources
from proxy.routes import (
    admin,
    admin_memories,
    admin_synonyms,
    chat,
    conflicts,
    console,
    governance,
    health,
    injections,
    mcp,
    memories,
    messages,
    models,
    responses,
    transfer,
    users,
)
from proxy.settings import (
    GLOBAL_NAMESPACE,
    GROUP_PREFIX,
    RESERVED_IDS_RULE,
    IdentitySettings,
    Settings,
    reserved_user_id,
)
from proxy.shutdown import Drain

log = structlog.get_logger("proxy.app")
FLUSH_INTERVAL_SECONDS = 1.0
# How often the gateway looks for an erasure whose purge had to wait (docs/design.md#erasure):
# an owed purge runs at most this long after its period ends.
PURGE_CHECK_SECONDS = 60.0
WORKER_STOP_SECONDS = 5.0  # the worker's time to hand its job back on shutdown
# Shutdown is bounded step by step (``_stop_tasks``, ``_bounded``): the background tasks
# get this long to end once cancelled, cancelled again every RECANCEL_SECONDS meanwhile;
# each final write (the sink's turns, access counts and usage, injection records) gets
# STOP_STEP_SECONDS — one Redis command's socket timeout. What runs out is logged and
# left: a hung dependency never holds the process open (README.md "Shutdown").
TASK_STOP_SECONDS = 5.0
RECANCEL_SECONDS = 0.1
STOP_STEP_SECONDS = 5.0
# Between backfill batches (vector-backfill task): leaves the CPU to requests.
BACKFILL_PAUSE_SECONDS = 0.05


def _render(path: str, error: ProxyError) -> Response:
    """``error`` in Anthropic's shape under ``/v1/messages`` (its clients read no other),
    in OpenAI's envelope elsewhere."""
    return messages.error_response(error) if messages.owns(path) else error_response(error)


async def _own_error(request: Request, exc: Exception) -> Response:
    """Any error of ours: answered with its :meth:`~MemoryProxyError.reply` (a warning
    logged when that is not the error itself), else as an unexpected failure."""
    assert isinstance(exc, MemoryProxyError)
    reply = exc.reply()
    if reply is None:
        return await _unexpected(request, exc)
    if reply is not exc:
        log.warning(exc.log_event, error=str(exc))
    return _render(request.url.path, reply)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        error: ProxyError = NotFoundError(f"Unknown path {request.url.path}.",
                                          code="unknown_url")
    elif exc.status_code == 405:
        error = InvalidRequestError(f"Method {request.method} is not allowed on "
                                    f"{request.url.path}.", code="method_not_allowed",
                                    status_code=405)
    else:
        error = ProxyError(str(exc.detail), status_code=exc.status_code)
    return _render(request.url.path, error)


async def _unexpected(request: Request, _exc: Exception) -> Response:
    log.exception("unhandled_error", path=request.url.path)
    return _render(request.url.path,
                   ProxyError("The gateway failed unexpectedly; see its logs."))


class _OneValueHeaders:
    """ASGI middleware: a request carrying a credential or identity header more than once
    (``X-User-Id: bob`` and ``X-User-Id: alice``, two ``Authorization`` headers) is a 400
    naming the header, on every route, before anything reads it — which value counts is
    never guessed (Starlette's ``headers.get`` reads the first, so a delete acted on the
    first user named). ``names``: the credential headers (``Authorization``, ``api-key``,
    ``x-api-key``, ``x-memory-proxy-key``: what :mod:`proxy.auth` and the Messages route
    read) and the identity settings' five headers. One
    pass over the raw header list."""

    def __init__(self, app: ASGIApp, identity: IdentitySettings) -> None:
        self.app = app
        shown = ["Authorization", "api-key", messages.ANTHROPIC_KEY_HEADER,
                 GATEWAY_KEY_HEADER, identity.user_header, identity.conversation_header,
                 identity.memory_header, identity.channel_header, identity.group_header]
        self.names = {name.lower().encode("latin-1"): name for name in shown}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            seen: set[bytes] = set()
            for key, _ in scope["headers"]:
                if key in self.names:
                    if key in seen:
                        name = self.names[key]
                        response = _render(str(scope.get("path", "")), InvalidRequestError(
                            f"Header {name} is sent more than once; send it once (which "
                            "value counts is never guessed).", param=name,
                            code="invalid_value"))
                        await response(scope, receive, send)
                        return
                    seen.add(key)
        await self.app(scope, receive, send)


class _AnswerUnexpected:
    """ASGI middleware: an exception no handler knows, raised before the response started,
    is answered 500 in the error envelope (Anthropic's under ``/v1/messages``) *here*, so
    the keep-alive connection stays open (Starlette's own last-resort handler re-raises
    after answering, and uvicorn then closes the connection). Raised after the response
    started (a stream), it propagates: the connection must close, as the client cannot be
    told otherwise."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            if started:
                raise
            log.exception("unhandled_error", path=scope.get("path"))
            response = _render(str(scope.get("path", "")),
                               ProxyError("The gateway failed unexpectedly; see its logs."))
            await response(scope, receive, send)


async def _every(seconds: float, action: Callable[[], Awaitable[None]], name: str,
                 *, stop: asyncio.Event, first: float | None = None) -> None:
    """Run ``action`` every ``seconds`` (the first time after ``first`` seconds, default
    ``seconds``), logging its failures; until cancelled or ``stop`` is set. A failure our
    error tree says needs no traceback (a store outage: the usage flush fails every second
    while it lasts) is a warning without one — rendering a traceback each second held the
    event loop, and so every chat, for seconds.

    ``stop`` is checked before each sleep because a cancellation can be lost: on Python
    3.11 ``asyncio.wait_for`` (which redis-py awaits for every command it sends) returns
    the finished send's result instead of raising when the cancel lands in the same loop
    turn, so an action cancelled mid-command may return normally."""
    delay = seconds if first is None else first
    while not stop.is_set():
        await asyncio.sleep(delay)
        delay = seconds
        try:
            await action()
        except MemoryProxyError as exc:
            if exc.log_traceback:
                log.exception("periodic_task_failed", task=name)
            else:
                log.warning("periodic_task_failed", task=name, error=str(exc)[:300])
        except Exception:
            log.exception("periodic_task_failed", task=name)


async def _warm_up(res: Resources) -> None:
    """Load what the first request would otherwise pay for, off the event loop."""
    tokenizers = {route.tokenizer for name in res.registry.names
                  for route in res.registry.routes(name)}
    # jieba is not loaded here: only when CJK text first appears (see proxy.memory.text).
    # The confusables tables every memory text check reads (proxy.memory.text).
    await asyncio.to_thread(load_confusables)
    for name in tokenizers:
        await asyncio.to_thread(res.counter.encoder, name)
    warm = getattr(res.upstream, "warm_up", None)
    if warm is not None and any(not r.relay for n in res.registry.names
                                for r in res.registry.routes(n)):
        await warm()


async def _backfill(res: Resources) -> None:
    """Vectors for memories stored without one of the configured embedder (see
    :mod:`proxy.memory.reindex`), in the background; a failure is logged, never fatal."""
    from proxy.memory.reindex import reindex
    from proxy.memory.vectors import MemoryVectors

    assert res.embedder is not None
    try:
        await reindex(res.store, MemoryVectors(
            res.embedder, ledger=res.ledger, clock=res.clock, metrics=res.metrics,
            timeout_seconds=res.settings.memory.embedder.timeout_seconds),
            pause_seconds=BACKFILL_PAUSE_SECONDS)
    except Exception as exc:  # the store is down: the next start (or reindex) does it
        log.warning("memory_reindex_failed", error=f"{type(exc).__name__}: {exc}"[:300])


# Users of one tenant listed per reserved id form at startup: enough to name the problem.
RESERVED_USERS_SHOWN = 20


async def _report_reserved_users(res: Resources) -> None:
    """Warn (``reserved_user_ids``) about known users of the configured tenants whose ids
    the gateway reserves (:func:`~proxy.settings.reserved_user_id`): their data stays
    stored, untouched, but no request can name them any more. One
    ranged read of the tenant's user index per reserved form; a failure is logged, never
    fatal."""
    auth = res.settings.auth
    tenants = sorted({k.tenant for k in (*auth.keys, *auth.admin_keys)} |
                     set(auth.jwt.tenants if auth.jwt else ()) |
                     ({OPEN_TENANT} if res.keyring.open_mode else set()))
    for tenant in tenants:
        found: list[str] = []
        try:
            for prefix in (GROUP_PREFIX, GLOBAL_NAMESPACE):
                # The greatest id sorting before ``prefix``: the page starts at it.
                before = prefix[:-1] + chr(ord(prefix[-1]) - 1) + "\U0010ffff" * 4
                page = await res.ledger.users(tenant, after=before, limit=RESERVED_USERS_SHOWN)
                found += [u.user for u in page if u.user.startswith(prefix)
                          and reserved_user_id(u.user)]
        except Exception as exc:
            log.warning("reserved_user_ids_unchecked", tenant=tenant,
                        error=f"{type(exc).__name__}: {exc}"[:300])
            continue
        if found:
            log.warning("reserved_user_ids", tenant=tenant, users=found,
                        detail=f"these users' ids are refused from now on ({RESERVED_IDS_RULE}); "
                               "their stored data is kept untouched")


async def _stop_tasks(tasks: list[asyncio.Task[None]], *, seconds: float) -> None:
    """Cancel ``tasks`` (the last started first) and wait up to ``seconds`` for them to
    end, cancelling again every :data:`RECANCEL_SECONDS` those still running (a lost
    cancellation, see :func:`_every`). Tasks still running then are logged
    (``background_tasks_not_stopped``) and left to the event loop; never raises."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    running = [task for task in reversed(tasks) if not task.done()]
    while running:
        left = deadline - loop.time()
        if left <= 0:
            log.error("background_tasks_not_stopped", seconds=seconds,
                      tasks=[task.get_name() for task in running])
            break
        for task in running:
            task.cancel()
        await asyncio.wait(running, timeout=min(RECANCEL_SECONDS, left))
        running = [task for task in running if not task.done()]
    for task in tasks:  # retrieved: an ended task's error is no "never retrieved" warning
        if task.done() and not task.cancelled():
            task.exception()


async def _bounded(step: Callable[[], Awaitable[None]], name: str,
                   seconds: float = STOP_STEP_SECONDS) -> None:
    """Run one shutdown ``step`` for at most ``seconds``; its failure, or running out
    (``shutdown_step_timed_out``), is logged and shutdown goes on."""
    try:
        async with asyncio.timeout(seconds):
            await step()
    except TimeoutError:
        log.warning("shutdown_step_timed_out", step=name, seconds=seconds)
    except Exception as exc:
        log.warning("shutdown_step_failed", step=name,
                    error=f"{type(exc).__name__}: {exc}"[:300])


@contextlib.asynccontextmanager
async def _running(res: Resources) -> AsyncIterator[None]:
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def flush() -> None:
        await res.memory.access.flush(res.store, res.clock())
        await res.usage.flush()

    async def record_injections() -> None:  # apart: a failing ledger never holds them
        await res.memory.injections.flush(res.store, res.clock())

    lag = res.memory.loop_lag
    if lag is not None:
        lag.start()  # recall's deadline counts only the time the loop was free
    tasks.append(asyncio.create_task(res.sink.run(), name="learning-sink"))
    tasks.append(asyncio.create_task(
        _every(FLUSH_INTERVAL_SECONDS, flush, "flush", stop=stop), name="flush"))
    tasks.append(asyncio.create_task(
        _every(FLUSH_INTERVAL_SECONDS, record_injections, "injection_records", stop=stop),
        name="injection-records"))
    tasks.append(asyncio.create_task(
        _every(res.settings.storage.index_maintenance_seconds, res.store.maintain,
               "index_maintenance", stop=stop, first=0.0),
        name="index-maintenance"))
    purge_every = min(PURGE_CHECK_SECONDS, res.settings.storage.erasure_purge_seconds)

    async def purge() -> None:
        await res.store.purge_erased()

    tasks.append(asyncio.create_task(_every(purge_every, purge, "erasure_purge", stop=stop),
                                     name="erasure-purge"))
    if res.embedder is not None and res.settings.memory.embedder.reindex_on_start:
        tasks.append(asyncio.create_task(_backfill(res), name="vector-backfill"))
    if res.worker is not None and res.settings.server.run_worker:
        worker = asyncio.create_task(res.worker.run(stop), name="learning-worker")
        # SIGTERM: the worker stops (releasing its job) at once, not after the streams.
        res.drain.on_begin(stop.set)

        def ended(task: asyncio.Task[None]) -> None:
            if stop.is_set():
                return
            # Worker.run ends only when stopped; anything else means no learning until a
            # restart, so it is logged loudly and /readyz says so (res.worker_task).
            error = None if task.cancelled() else task.exception()
            log.error("learning_worker_ended", cancelled=task.cancelled(),
                      error=repr(error) if error is not None else None,
                      exc_info=error)

        worker.add_done_callback(ended)
        res.worker_task = worker
        tasks.append(worker)
    monitor = alert_monitor(res, gateway=True)
    if monitor is not None:
        tasks.append(asyncio.create_task(monitor.run(), name="alerts"))
    try:
        yield
    finally:
        stop.set()
        if res.worker_task is not None:  # let it release its job before cancelling
            await asyncio.wait({res.worker_task}, timeout=WORKER_STOP_SECONDS)
        await _stop_tasks(tasks, seconds=TASK_STOP_SECONDS)
        if lag is not None:
            await lag.stop()
        res.worker_task = None
        await _bounded(res.sink.aclose, "learning_sink_close")
        await _bounded(flush, "flush")
        await _bounded(record_injections, "injection_records")


def create_app(settings: Settings, resources: Resources | None = None, *,
               freeze_gc: bool = True) -> Starlette:
    """The gateway app. ``resources`` (tests) are used as given and not closed here.
    ``freeze_gc``: keep what the lifespan loaded out of the cyclic collector while the app
    runs (below); ``False`` leaves the process's collector alone — for a process that runs
    many apps one after another (the test suite's gateways), where the full collection
    before each freeze walks everything that process holds."""

    drain = Drain(settings.server.shutdown_grace_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            res = resources if resources is not None else \
                await stack.enter_async_context(open_resources(settings))
            res.drain = drain  # the one GatewayServer.shutdown() starts
            app.state.resources = res
            if not res.registry.names:
                log.warning("no_models_configured",
                            detail="model_list is empty: every chat request will be a 404")
            for deployment in settings.model_list:
                if deployment.litellm_params.literal_api_key:
                    log.warning("upstream_key_literal", model=deployment.model_name,
                                detail="litellm_params.api_key is written out in the config; "
                                       "use os.environ/NAME so the secret stays in the "
                                       "environment")
                missing = deployment.litellm_params.missing_api_key_env
                if missing:
                    log.warning("upstream_key_missing", model=deployment.model_name,
                                env=missing,
                                detail=f"set {missing}; until then this model answers 500")
            if res.keyring.open_mode:
                log.warning("auth_open_mode",
                            detail="no auth.keys configured: every caller is tenant "
                                   "'default'; configure keys before exposing the gateway")
            await _report_reserved_users(res)
            await _warm_up(res)
            # Everything loaded so far (jieba's dictionary, tokenizers, models) lives for
            # the whole process: keep it out of the cyclic collector's full passes, whose
            # pauses set the recall p99 (measured by bench/store_latency.py).
            # The freeze lasts as long as the lifespan: unfrozen at its end, so that what
            # this app held can be collected (several apps in one process, as in tests,
            # would otherwise keep every earlier one).
            if freeze_gc:
                gc.collect()
                gc.freeze()
                stack.callback(gc.unfreeze)
            await stack.enter_async_context(_running(res))
            await stack.enter_async_context(mcp_endpoint.running())
            log.info("gateway_started", models=res.registry.names,
                     learning=res.learning_enabled, storage=settings.storage.backend)
            yield
        log.info("gateway_stopped")

    mcp_endpoint = mcp.McpEndpoint()
    routes = [
        Route("/v1/chat/completions", chat.chat_completions, methods=["POST"]),
        Route("/chat/completions", chat.chat_completions, methods=["POST"]),
        Route("/v1/responses", responses.create_response, methods=["POST"]),
        Route("/v1/messages", messages.create_message, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        Route("/mcp", mcp_endpoint),  # GET, POST, DELETE: the MCP streamable HTTP transport
        Route("/v1/models", models.list_models, methods=["GET"]),
        Route("/models", models.list_models, methods=["GET"]),
        Route("/v1/memories", memories.list_memories, methods=["GET"]),
        Route("/v1/memories", memories.create_memory, methods=["POST"]),
        Route("/v1/memories", memories.clear_memories, methods=["DELETE"]),
        Route("/v1/memories/flush", memories.flush_learning, methods=["POST"]),
        # the user's own memory (fixed paths before /v1/memories/{memory_id})
        Route("/v1/memories/export", transfer.export_memories, methods=["GET"]),
        Route("/v1/memories/import", transfer.import_memories, methods=["POST"]),
        Route("/v1/memories/stats", memories.memory_stats, methods=["GET"]),
        # Before /v1/memories/{memory_id}: docs/design.md#conflicts.
        Route("/v1/memories/conflicts", conflicts.list_conflicts, methods=["GET"]),
        Route("/v1/memories/conflicts/{conflict_id}/confirm", conflicts.confirm_conflict,
              methods=["POST"]),
        Route("/v1/memories/conflicts/{conflict_id}/reverse", conflicts.reverse_conflict,
              methods=["POST"]),
        Route("/v1/profile/history", conflicts.profile_history, methods=["GET"]),
        Route("/v1/admin/conflicts", conflicts.admin_conflicts, methods=["GET"]),
        Route("/v1/memories/injections/{injection_id}", injections.get_injection,
              methods=["GET"]),
        Route("/v1/memories/preview", injections.preview, methods=["POST"]),
        Route("/v1/memories/{memory_id}", memories.patch_memory, methods=["PATCH"]),
        Route("/v1/profile", users.get_profile, methods=["GET"]),
        Route("/v1/settings", users.get_settings, methods=["GET"]),
        Route("/v1/settings", users.patch_settings, methods=["PATCH"]),
        Route("/v1/me", users.whoami, methods=["GET"]),
        Route("/v1/me", users.erase_me, methods=["DELETE"]),
        Route("/openapi.json", openapi.openapi_json, methods=["GET"]),
        Route("/v1/memories/{memory_id}", memories.get_memory, methods=["GET"]),
        Route("/v1/memories/{memory_id}", memories.delete_memory, methods=["DELETE"]),
        Route("/v1/admin/prompts/{kind}", admin.get_prompt, methods=["GET"]),
        Route("/v1/admin/prompts/{kind}", admin.put_prompt, methods=["PUT"]),
        Route("/v1/admin/dead-letters", admin.dead_letters, methods=["GET"]),
        Route("/v1/admin/dead-letters/{job_id:path}/requeue", admin.requeue,
              methods=["POST"]),
        Route("/v1/admin/dead-letters/{job_id:path}", admin.drop_dead_letter,
              methods=["DELETE"]),
        # admins govern (proxy/routes/governance.py)
        Route("/v1/admin/audit", governance.audit_log, methods=["GET"]),
        Route("/v1/admin/usage", governance.usage, methods=["GET"]),
        Route("/v1/admin/users", governance.users, methods=["GET"]),
        Route("/v1/admin/stats", governance.stats, methods=["GET"]),
        Route("/v1/admin/settings", governance.get_settings, methods=["GET"]),
        Route("/v1/admin/settings", governance.patch_settings, methods=["PATCH"]),
        Route("/v1/admin/prompts/{kind}/versions", governance.prompt_versions,
              methods=["GET"]),
        Route("/v1/admin/prompts/{kind}/versions/{version}/restore",
              governance.restore_prompt, methods=["POST"]),
        Route("/v1/admin/memories", admin_memories.list_admin_memories, methods=["GET"]),
        Route("/v1/admin/memories", admin_memories.create_admin_memory, methods=["POST"]),
        Route("/v1/admin/memories/{memory_id}/promote", admin_memories.promote,
              methods=["POST"]),
        Route("/v1/admin/memories/{memory_id}", admin_memories.patch_admin_memory,
              methods=["PATCH"]),
        Route("/v1/admin/memories/{memory_id}", admin_memories.delete_admin_memory,
              methods=["DELETE"]),
        # candidate synonyms (proxy/routes/admin_synonyms.py)
        Route("/v1/admin/synonyms/candidates", admin_synonyms.candidates, methods=["GET"]),
        Route("/v1/admin/synonyms/candidates/{candidate_id}/accept", admin_synonyms.accept,
              methods=["POST"]),
        Route("/v1/admin/synonyms/candidates/{candidate_id}/reject", admin_synonyms.reject,
              methods=["POST"]),
        Route("/healthz", health.healthz, methods=["GET"]),
        Route("/readyz", health.readyz, methods=["GET"]),
        Route("/metrics", health.metrics, methods=["GET"]),
        # The web console: static files under a strict CSP.
        Mount("/console", app=console.ConsoleFiles(), name="console"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(AccessLogMiddleware, settings=settings.server),
                    Middleware(_AnswerUnexpected),
                    Middleware(_OneValueHeaders, identity=settings.identity)],
        exception_handlers={
            MemoryProxyError: _own_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
    app.state.drain = drain
    return app
