"""CPU of checking a chat request: ``parse_chat_request`` of this tree beside a baseline's.

Command (from the repository root)::

    .venv/bin/python -m bench.request_parse                    # baseline e05d13b, ~10 s
    .venv/bin/python -m bench.request_parse --baseline HEAD~3

The baseline's ``proxy/request.py`` (or ``proxy/request/chat.py``) is read with
``git show`` and run in this process. Three typical bodies: a short chat (a system and a
user message), a 20-message chat with tool calls and five tools (streamed, usage asked
for), a multimodal message (two text parts, a ~20 KB data URL and an image URL). Printed:
CPU µs per call (process time, best of ``--rounds`` interleaved rounds of 20,000 calls),
baseline beside this tree, and the difference.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import timeit
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from proxy.request import parse_chat_request

ROOT = Path(__file__).resolve().parent.parent
CALLS = 20_000


def _bodies() -> dict[str, dict[str, Any]]:
    tools = [{"type": "function", "function": {
        "name": f"t{i}", "description": "d" * 80,
        "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}
        for i in range(5)]
    messages: list[dict[str, Any]] = []
    for i in range(10):
        messages.append({"role": "user", "content": f"question {i} " * 20})
        if i % 3 == 0:
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function",
                 "function": {"name": "t1", "arguments": '{"a": "x"}'}}]})
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok " * 10})
        else:
            messages.append({"role": "assistant", "content": f"answer {i} " * 30})
    return {
        "short chat": {"model": "gpt-4o-mini", "user": "u1", "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Hi, how are you today?"}]},
        "20 messages + tools": {"model": "gpt-4o", "messages": messages[:20], "tools": tools,
                                "stream": True, "stream_options": {"include_usage": True},
                                "temperature": 0.2},
        "multimodal": {"model": "gpt-4o", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 20000}},
            {"type": "text", "text": "and this"},
            {"type": "image_url", "image_url": {"url": "https://example.com/x.png",
                                                "detail": "high"}}]}]},
    }


def _baseline(revision: str) -> Callable[[bytes], Any]:
    for path in ("proxy/request.py", "proxy/request/chat.py"):
        shown = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT,
                               capture_output=True, text=True, check=False)
        if shown.returncode == 0:
            module = types.ModuleType("baseline_request")
            sys.modules[module.__name__] = module  # dataclasses look their module up
            exec(compile(shown.stdout, f"{revision}:{path}", "exec"), module.__dict__)  # noqa: S102
            parse: Callable[[bytes], Any] = module.parse_chat_request
            return parse
    raise SystemExit(f"no chat request parser at {revision}")


def _micros(old: Callable[[bytes], Any], new: Callable[[bytes], Any], raw: bytes,
            rounds: int) -> tuple[float, float]:
    """Best CPU µs per call of each parser, their rounds interleaved (process time: other
    processes on a busy machine are not counted)."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for slot, parse in enumerate((old, new)):
            timer = timeit.Timer(lambda p=parse: p(raw), timer=time.process_time)
            seconds = timer.timeit(number=CALLS)
            best[slot] = min(best[slot], seconds / CALLS * 1e6)
    return best[0], best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="e05d13b", help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per parser")
    args = parser.parse_args()
    old = _baseline(args.baseline)
    print(f"{'body':22} {args.baseline:>10} {'this tree':>10} {'added':>8}   (µs per call)")
    for name, body in _bodies().items():
        raw = orjson.dumps(body)
        before, after = _micros(old, parse_chat_request, raw, args.rounds)
        print(f"{name:22} {before:10.2f} {after:10.2f} {after - before:+8.2f}")


if __name__ == "__main__":
    main()
