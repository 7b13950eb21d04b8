"""Run the README's client snippets against a real gateway and say whether each one's user
reached it. A check for a person to rerun, not part of CI.

    .venv/bin/python docs/clients-check.py \\
        --python langchain=/tmp/v-langchain/bin/python --python llm=/tmp/v-llm/bin/python …

Each ``<!-- client: NAME -->`` marker of README.md is followed by the snippet (a ```python
block; for ``llm`` a ```bash block, its model file a ```yaml block after ``llm-models``). The script
starts a fake OpenAI-compatible upstream on 127.0.0.1 (chat completions, streamed or not;
a tool call or JSON built from the request's schema when it asks for one), then
``memory-proxy serve`` from this checkout on a free port with two models, ``local`` and
``gpt-4o-mini``, at the fake, an app key, learning off and the access log's user in
plain text, and gives alice one memory ("Lives in Lisbon"). Every snippet runs unchanged
but for the port and ``<gateway key>``, with the interpreter given for its client
(``--python NAME=PATH``; default: this one), in an empty directory, with
``OPENAI_API_KEY`` unset. The snippets of test dependencies (openai, anthropic, mcp) also
run in CI: tests/test_readme_clients.py.

A snippet passes when it exits 0 and the gateway shows its user got memory: a chat request
reached the upstream with alice's memory in it and the gateway's access line for it names
``user=alice`` (``mcp``: the memory it added is in alice's list; ``previous-response-id``:
the follow-up with ``previous_response_id`` is the documented 400 and the resent history
works). Prints one line per client with the library's version; exit 1 when any failed.
Install each client into a venv of its own (their pins conflict): ``python3 -m venv v && v/bin/pip
install openai langchain-openai`` and so on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
KEY = "check-app-key"
MEMORY = "Lives in Lisbon"
# The distribution whose version each client's line reports.
DISTRIBUTIONS = {
    "openai": "openai",
    "openai-responses": "openai",
    "langchain": "langchain-openai",
    "openai-agents": "openai-agents",
    "openai-agents-chat": "openai-agents",
    "pydantic-ai": "pydantic-ai-slim",
    "llama-index": "llama-index-llms-openai-like",
    "instructor": "instructor",
    "llm": "llm",
    "anthropic": "anthropic",
    "mcp": "mcp",
    "previous-response-id": "openai",
}


# ----------------------------------------------------------------- fake upstream


def _sample(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A value that satisfies a simple JSON schema (objects, strings, numbers, lists)."""
    if "$ref" in schema:
        return _sample(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for combo in ("anyOf", "oneOf", "allOf"):
        if combo in schema:
            return _sample(schema[combo][0], defs)
    kind = schema.get("type", "object")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: _sample(sub, defs) for name, sub in props.items()}
    if kind == "array":
        return [_sample(schema.get("items", {"type": "string"}), defs)]
    if "enum" in schema:
        return schema["enum"][0]
    return {"string": "Lisbon", "integer": 1, "number": 1.0, "boolean": True}.get(kind, "Lisbon")


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    """The assistant message for a chat request: a tool call when tools are offered (the
    structured-output libraries ask for one), JSON for a JSON schema, else text."""
    tools = body.get("tools") or []
    if tools:
        fn = tools[0]["function"]
        params = fn.get("parameters") or {}
        args = _sample(params, params.get("$defs", {}))
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": fn["name"], "arguments": json.dumps(args)},
                }
            ],
        }
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        schema = fmt["json_schema"].get("schema") or {}
        return {
            "role": "assistant",
            "content": json.dumps(_sample(schema, schema.get("$defs", {}))),
        }
    return {"role": "assistant", "content": "You live in Lisbon."}


@dataclass
class Upstream:
    requests: list[dict[str, Any]] = field(default_factory=list)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        message = _answer(body)
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        usage = {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}
        base = {"id": "chatcmpl-check", "created": int(time.time()), "model": body["model"]}
        if not body.get("stream"):
            return web.json_response(
                {
                    **base,
                    "object": "chat.completion",
                    "usage": usage,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                }
            )
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        delta = dict(message)
        if delta.get("tool_calls"):
            delta["tool_calls"] = [{"index": 0, **delta["tool_calls"][0]}]
        chunks = [
            {"index": 0, "delta": delta, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": finish},
        ]
        for choice in chunks:
            event = {**base, "object": "chat.completion.chunk", "choices": [choice]}
            await reply.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            event = {**base, "object": "chat.completion.chunk", "choices": [], "usage": usage}
            await reply.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await reply.write(b"data: [DONE]\n\n")
        return reply

    def saw_memory(self, since: int) -> bool:
        return any(MEMORY in json.dumps(body) for body in self.requests[since:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------ the snippets


def snippets(text: str) -> dict[str, dict[str, str]]:
    """``{client: {language: code}}``: the first fenced block after each
    ``<!-- client: NAME -->`` of the README (``llm-models`` holds the ``llm`` model file)."""
    found: dict[str, dict[str, str]] = {}
    for mark in re.finditer(r"<!-- client: ([\w-]+) -->\n", text):
        fence = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL).search(text, mark.end())
        if fence is not None:
            found[mark.group(1)] = {fence.group(1): fence.group(2)}
    models = found.pop("llm-models", {})
    if "llm" in found:
        found["llm"].update(models)
    return found


def _localise(code: str, port: int) -> str:
    return code.replace("127.0.0.1:8080", f"127.0.0.1:{port}").replace("<gateway key>", KEY)


@dataclass
class Result:
    client: str
    version: str
    ok: bool
    detail: str


async def _run(argv: list[str], *, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=180)
    return proc.returncode or 0, out.decode(errors="replace")


async def _version(python: str, dist: str) -> str:
    code, out = await _run(
        [python, "-c", f"import importlib.metadata as m, sys; print(m.version({dist!r}))"],
        cwd=ROOT,
        env=dict(os.environ),
    )
    return out.strip() if code == 0 else "not installed"


@dataclass
class Gateway:
    port: int
    log: Path

    def users_since(self, offset: int) -> list[str]:
        lines = self.log.read_text(errors="replace")[offset:].splitlines()
        users = []
        for line in lines:
            if "http_request" in line and '"user"' in line:
                try:
                    users.append(json.loads(line).get("user"))
                except json.JSONDecodeError:
                    continue
        return users

    def offset(self) -> int:
        return len(self.log.read_text(errors="replace"))


async def check(
    name: str, blocks: dict[str, str], *, python: str, gw: Gateway, upstream: Upstream, work: Path
) -> Result:
    version = await _version(python, DISTRIBUTIONS.get(name, name))
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(
        {"PATH": f"{Path(python).parent}:{env.get('PATH', '')}", "LLM_USER_PATH": str(folder)}
    )
    since, offset = len(upstream.requests), gw.offset()
    if name == "llm":
        (folder / "extra-openai-models.yaml").write_text(_localise(blocks["yaml"], gw.port))
        argv = ["bash", "-euo", "pipefail", "-c", _localise(blocks["bash"], gw.port)]
        argv[-1] = argv[-1].replace("trial-app", KEY)
    else:
        script = folder / "snippet.py"
        script.write_text(_localise(blocks["python"], gw.port))
        argv = [python, str(script)]
    code, out = await _run(argv, cwd=folder, env=env)
    await asyncio.sleep(0.3)  # the access line is written after the last byte
    last = out.strip().splitlines()[-1][:80] if out.strip() else ""
    if code != 0:
        return Result(name, version, False, f"exit {code}: {out.strip()[-600:]}")
    if name == "mcp":
        stored = await _alice_memories(gw)
        ok = "Allergic to peanuts" in stored and "peanuts" in out
        return Result(name, version, ok, f"alice's memories: {stored}")
    users = gw.users_since(offset)
    injected = upstream.saw_memory(since)
    ok = injected and "alice" in users
    if name == "previous-response-id":
        ok = ok and "400" in out
    return Result(
        name,
        version,
        ok,
        f"memory injected: {injected}; access log users: "
        f"{sorted({u for u in users if u})}; prints {last!r}",
    )


async def _alice_memories(gw: Gateway) -> list[str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{gw.port}/v1/memories",
            headers={"Authorization": f"Bearer {KEY}", "X-User-Id": "alice"},
        ) as reply,
    ):
        return sorted(m["content"] for m in (await reply.json())["data"])


# ---------------------------------------------------------------------- the gateway


async def start_gateway(
    upstream_port: int, work: Path
) -> tuple[asyncio.subprocess.Process, Gateway]:
    port = _free_port()
    config = work / "check.yaml"
    config.write_text(f"""
model_list:
  - model_name: local
    litellm_params: {{model: openai/local, api_base: "http://127.0.0.1:{upstream_port}/v1"}}
    model_info: {{max_input_tokens: 16000}}
  - model_name: gpt-4o-mini
    litellm_params: {{model: openai/local, api_base: "http://127.0.0.1:{upstream_port}/v1"}}
    model_info: {{max_input_tokens: 16000}}
learning: {{enabled: false}}
server: {{access_log_user: plain, log_level: info}}
storage: {{path: {work / "check.db"}}}
auth:
  keys: [{{key: os.environ/CHECK_APP_KEY, tenant: check, name: app}}]
""")
    log = work / "gateway.log"
    env = {**os.environ, "CHECK_APP_KEY": KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
        cwd=work,
        env=env,
        stdout=log.open("wb"),
        stderr=asyncio.subprocess.STDOUT,
    )
    gw = Gateway(port, log)
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(f"http://127.0.0.1:{port}/readyz") as reply:
                    if reply.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            if proc.returncode is not None:
                raise SystemExit(f"gateway exited: {log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        async with http.post(
            f"http://127.0.0.1:{port}/v1/memories",
            json={"content": MEMORY},
            headers={"Authorization": f"Bearer {KEY}", "X-User-Id": "alice"},
        ) as reply:
            if reply.status >= 300:
                raise SystemExit(f"seeding alice's memory: {reply.status} {await reply.text()}")
    return proc, gw


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        metavar="CLIENT=PATH",
        help="interpreter that has CLIENT's library (default: this one)",
    )
    parser.add_argument("--only", action="append", default=[], metavar="CLIENT")
    parser.add_argument("--readme", type=Path, default=README, help="another copy to check")
    args = parser.parse_args()
    pythons = dict(item.split("=", 1) for item in args.python)
    found = snippets(args.readme.read_text(encoding="utf-8"))
    if args.only:
        found = {k: v for k, v in found.items() if k in args.only}
    upstream = Upstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    upstream_port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", upstream_port).start()
    with tempfile.TemporaryDirectory(prefix="clients-check-") as tmp:
        proc, gw = await start_gateway(upstream_port, Path(tmp))
        try:
            results = [
                await check(
                    name,
                    blocks,
                    python=pythons.get(name, sys.executable),
                    gw=gw,
                    upstream=upstream,
                    work=Path(tmp),
                )
                for name, blocks in found.items()
            ]
        finally:
            proc.terminate()
            await proc.wait()
            await runner.cleanup()
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.client:<22} {r.version:<10} {r.detail}")
    return 0 if results and all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
