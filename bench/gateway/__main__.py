"""Gateway overhead benchmark: direct call vs memory-proxy (memory off / on) vs LiteLLM proxy.

Command (from the repository root, after ``scripts/bootstrap test``)::

    .venv/bin/python -m bench.gateway            # full run: 3 A/B rounds, ~12 min
    .venv/bin/python -m bench.gateway --quick    # sanity run: 1 round, short, ~3 min
    .venv/bin/python -m bench.gateway --soak 20000   # leak soak instead of the table

Everything it needs comes from PyPI through pip: LiteLLM's proxy is installed on first use
into its own virtualenv, ``.bench/litellm-venv`` (``litellm[proxy]==1.108.7`` — the
release the reference figures were measured with; ``--litellm-spec`` picks another, and the
compromised 1.82.7 / 1.82.8 are refused). Runs write configs, databases, logs and
``results.json`` under ``.bench/gateway/<time>/``.

What runs where (2 cores):
    core 1 (``--server-core``): the server under test, one process, one worker —
        ``memory-proxy serve --config <generated yaml>`` or
        ``litellm --config <yaml> --num_workers 1`` — each started with ``taskset``; the
        servers not being measured are paused with SIGSTOP so they cannot take its CPU.
    core 0 (``--client-core``): the fake OpenAI-compatible upstream
        (``bench/gateway/fake_upstream.py``: raw asyncio + httptools, tens of µs per reply;
        20 ``chat.completion.chunk`` events per streamed reply written in one burst, the
        last with ``finish_reason``, then a usage chunk when asked) and this process, the
        load generator (raw keep-alive HTTP/1.1 connections on 127.0.0.1, closed loop).

Targets (columns):
    direct        the fake upstream called directly: the floor every other column is
                  compared with.
    gw mem-off    memory-proxy, requests without a user id (pass-through, no recall).
    gw mem-on     memory-proxy, ``X-User-Id`` of one user with 500 memories seeded through
                  the store API (embedded SQLite, keyword recall); the memory block is
                  spliced into every request (see "memory injected").
    gw mem-on+emb the same user and memories, each with its all-MiniLM-L6-v2 vector, and
                  ``memory.embedder.provider: local`` (hybrid recall; the query-vector
                  cache off, since the benchmark repeats its 48 questions): what
                  local-embedding recall adds, printed under the targets. Needs the
                  ``embeddings`` extra; skipped with a note without it.
    gw mem-on+static  the same with ``memory.embedder.provider: static`` (model2vec
                  distilled from all-MiniLM-L6-v2 into ``--embedder-cache``, default
                  ``.bench/embedders``; made there on first use, ~2 min CPU) and its
                  vectors: hybrid recall without torch. Needs the ``static`` extra.
    LiteLLM proxy litellm's proxy server, no database, ``LITELLM_LOG=ERROR``.
    Learning is off in the gateway's config: the figures are the request path's.
    The same 48 conversations go to every target; only the user header differs.

Scenarios: concurrency 1 and 32 (``--concurrency``), non-streaming (``json``) and
streaming with the whole stream in one burst (``stream``), plus at c=32 ``paced``: streams
whose 20 events come ~10 ms apart (``--paced-ms``, ×0.5–1.5 per stream), as a real model
streams. A closed loop of 32 clients with burst streams keeps the server saturated, so its
TTFT is mostly queueing (Little's law: ~32 × CPU per request); ``paced`` is the scenario
in which 32 concurrent streams overlap without saturating it. Every round runs every
scenario on every target, the target order reversed on odd rounds (A/B/A/B); figures pool
all rounds. Each measurement is preceded by 100 discarded warm-up requests and is bounded
by ``--requests`` (1000 at c=1, 3000 at c=32) and ``--seconds`` (10 s), whichever comes
first. The machine may be shared: a measurement during which other processes took more
than ``--quiet`` (15 %) of the cores in use is taken again, up to ``--retries`` (2) times.

Rows:
    added TTFT p50/p99 ms  the target's time to first body byte (first SSE ``data:`` line
                  for streams), request written → bytes received by the client, at the
                  50th / 99th percentile, minus the direct call's same percentile in the
                  same scenario. The direct column shows its absolute p50/p99 in brackets.
    requests/s    completed requests ÷ wall time of the measurements. At c=32 the server's
                  core is saturated, so this is its throughput on one core.
    CPU ms/request  user + system CPU of the server's process tree (``/proc/<pid>/stat``
                  utime+stime, its threads included, plus reaped children) from just
                  before the load to 1 s after the last reply (so deferred work such as
                  ledger flushes and logging callbacks is charged), ÷ requests. Each
                  figure spans seconds of CPU, so the 10 ms clock tick is well below 1 %.
                  Direct: the fake upstream's own CPU.
    other processes on our cores %  CPU that processes outside the benchmark took on the
                  cores in use during the measurements (``/proc/stat`` minus ours), as a
                  share of wall time: how far the figures may be off a quiet machine.
    requests measured / errors  pooled counts; an error is a failed connection, a status
                  other than 200, a stream without ``data: [DONE]``, a JSON reply without
                  ``choices``, or a timeout (30 s).
    memory injected  share of replies whose ``X-Memory-Status`` was ``injected``.
    startup to first reply s  process start (``Popen``) → first good non-streaming reply,
                  polling every 20 ms, nothing else running on its core.
    idle RSS MB   ``VmRSS`` of the process tree 2 s after that first reply.
    peak RSS MB   ``VmHWM`` (high-water mark) at the end of the run.
    mem-on÷LiteLLM  the gateway with memory on divided by LiteLLM (× for requests/s).

The gateway's targets are printed under the table with met / NOT met, then the
hot-path targets (memory on, keyword recall: ≤ 1.0 ms CPU and ≤ 1.0 ms added TTFT p50 per
request at c=1, ≤ 15 ms added TTFT p99 for paced streams at c=32; with embeddings, local
or static: ≤ 3 ms CPU per request at c=1 and no ``degraded`` reply at c=32). Every
gateway target runs this checkout's code (``PYTHONPATH``), whatever tree the virtualenv's
editable install points at.

Other options: ``--profile gw-on`` samples that target with py-spy during the measured
load (collapsed stacks and a summary per scenario in the run directory); ``--variant
NAME=DIR`` also runs the gateway from the source tree DIR (``git archive <commit> proxy |
tar -x -C DIR``) as targets ``NAME-off`` / ``NAME-on`` (and ``NAME-static`` when gw-static is
among the targets), for before/after figures from one run; ``--targets`` picks columns;
``--concurrency`` the levels; ``--restart`` starts every server afresh (new process, fresh
copy of its database) before each round after the first. Two processes of the same code
have differed here by up to 0.24 ms CPU per request at c=1 (memory layout, string
hashing): to compare two trees within less than that, run ``--restart`` with ``--rounds``
5 or more, so that each column pools as many processes as rounds.

``--soak N`` starts only the gateway (memory on) and sends N requests — non-streaming and
streaming segments alternating, 1 in 50 streams dropped by the client after the first
event, a quarter of the requests from 64 other users — printing VmRSS, open fds, threads
and asyncio tasks (the gateway's ``memory_proxy_event_loop_tasks`` gauge) over time,
compressed to 12 points, and a leak verdict (exit status 1 on a leak or an error).
"""

from __future__ import annotations

import sys

from bench.gateway.run import main

if __name__ == "__main__":
    sys.exit(main())
