"""What the benchmark starts: the fake upstream, our gateway, LiteLLM's proxy.

Each server is started the way its users start it — ``memory-proxy serve --config <yaml>``,
``litellm --config <yaml>`` — pinned to a core with ``taskset``. LiteLLM's proxy lives in
its own virtualenv (``.bench/litellm-venv``), created here on first use from PyPI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from bench.gateway import procs

ROOT = Path(__file__).resolve().parents[2]
MODEL = "gpt-4o-mini"  # what clients ask for; the upstream model id is the same
PACED_MODEL = MODEL + "-paced"  # same upstream; it spaces this model's stream events
UPSTREAM_KEY_ENV = "BENCH_UPSTREAM_KEY"
GATEWAY_KEY_ENV = "BENCH_GATEWAY_KEY"
ADMIN_KEY_ENV = "BENCH_ADMIN_KEY"
# The key clients present to every target: our gateway's auth key, LiteLLM's master key.
CLIENT_KEY = "sk-bench-4d1c9e7a0b2f46a8b3e5c7d9f1a2b3c4"
# The admin key of tenant ``default`` (a config made with ``admin=True``).
ADMIN_KEY = "sk-bench-admin-8e2f6a1c9d3b47e5a0c4f7b2d6e8a1c3"
# 1.108.7 is the release the reference figures were measured with. 1.82.7 and 1.82.8 were
# compromised releases (supply-chain incident) and must never be installed.
LITELLM_SPEC = "litellm[proxy]==1.108.7"
EXCLUDED_LITELLM = ("1.82.7", "1.82.8")
BASE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of the model cost map
    "HF_HUB_OFFLINE": "1",
    UPSTREAM_KEY_ENV: "sk-bench-upstream",
    GATEWAY_KEY_ENV: CLIENT_KEY,
    ADMIN_KEY_ENV: ADMIN_KEY,
    "PYTHONUNBUFFERED": "1",
}


def upstream_argv(*, port: int, chunks: int, usage: str, interval_ms: float,
                  paced_ms: float) -> list[str]:
    return [sys.executable, "-m", "bench.gateway.fake_upstream", "--port", str(port),
            "--chunks", str(chunks), "--usage", usage, "--interval-ms", str(interval_ms),
            "--paced-ms", str(paced_ms)]


def _model_list(upstream_port: int) -> list[dict[str, object]]:
    return [{
        "model_name": name,
        "litellm_params": {"model": f"openai/{name}",
                           "api_base": f"http://127.0.0.1:{upstream_port}/v1",
                           "api_key": f"os.environ/{UPSTREAM_KEY_ENV}"},
        "model_info": {"max_input_tokens": 128000},
    } for name in (MODEL, PACED_MODEL)]


def gateway_config(path: Path, *, port: int, upstream_port: int, db: Path,
                   embedder: str | None = None, cache_dir: Path | None = None,
                   admin: bool = False) -> Path:
    """A ``memory-proxy`` config: one relayed model on the fake upstream, embedded SQLite,
    one gateway key (tenant ``default``), learning off (the benchmark measures the request
    path, not what learning spends). ``embedder``: hybrid recall with that provider
    (``local``: all-MiniLM-L6-v2; ``static``: its model2vec distillation in ``cache_dir``)
    and its query cache off — a real user's every turn is a new
    text, while the benchmark repeats 48 questions, which a cache would answer for free.
    ``admin``: also an admin key for the tenant (:data:`ADMIN_KEY`, from
    :data:`ADMIN_KEY_ENV`), for benchmarks that change its run-time settings."""
    auth: dict[str, object] = {
        "keys": [{"key": f"os.environ/{GATEWAY_KEY_ENV}", "name": "bench"}]}
    if admin:
        auth["admin_keys"] = [{"key": f"os.environ/{ADMIN_KEY_ENV}", "name": "bench-admin"}]
    config: dict[str, object] = {
        "model_list": _model_list(upstream_port),
        "server": {"host": "127.0.0.1", "port": port},
        "storage": {"backend": "sqlite", "path": str(db)},
        "learning": {"enabled": False},
        "auth": auth,
    }
    if embedder:
        config["memory"] = {"embedder": {"provider": embedder, "model": "all-MiniLM-L6-v2",
                                         "cache_size": 0, "cache_dir": str(cache_dir or ""),
                                         "reindex_on_start": False}}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def gateway_argv(config: Path) -> list[str]:
    exe = Path(sys.executable).with_name("memory-proxy")
    return [str(exe), "serve", "--config", str(config)]


def litellm_config(path: Path, *, upstream_port: int) -> Path:
    """LiteLLM proxy config: the same model on the same fake upstream, no database."""
    config = {
        "model_list": _model_list(upstream_port),
        "litellm_settings": {"telemetry": False, "drop_params": True},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def litellm_argv(venv: Path, config: Path, *, port: int) -> list[str]:
    return [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", "1"]


LITELLM_ENV = {
    **BASE_ENV,
    "LITELLM_LOG": "ERROR",  # quiet: no per-request access log lines (as ours)
    "LITELLM_MODE": "PRODUCTION",  # do not read a .env file
    "LITELLM_MASTER_KEY": CLIENT_KEY,  # it refuses to start without one
}


def ensure_litellm(venv: Path, spec: str = LITELLM_SPEC, *, quiet: bool = True) -> str:
    """Create ``venv`` with ``spec`` installed (once; a stamp file records the spec).
    Returns the installed litellm version. Refuses the compromised releases."""
    if any(f"=={bad}" in spec.replace(" ", "") for bad in EXCLUDED_LITELLM):
        raise SystemExit(f"refusing to install {spec}: compromised release")
    guarded = spec if "==" in spec else spec + "".join(f",!={v}" for v in EXCLUDED_LITELLM)
    stamp = venv / ".bench-installed"
    python = venv / "bin" / "python"
    if not (stamp.is_file() and stamp.read_text() == guarded and python.exists()):
        print(f"setting up LiteLLM's proxy in {venv} ({guarded}) …", flush=True)
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
        if quiet:
            pip.append("--quiet")
        subprocess.run([*pip, guarded], check=True)
        stamp.write_text(guarded)
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    if version in EXCLUDED_LITELLM:
        raise SystemExit(f"litellm {version} in {venv} is a compromised release: delete it")
    return version


def start_upstream(*, core: int, logs: Path, chunks: int, usage: str,
                   interval_ms: float, paced_ms: float) -> procs.Proc:
    port = procs.free_port()
    return procs.start("upstream", upstream_argv(port=port, chunks=chunks, usage=usage,
                                                 interval_ms=interval_ms, paced_ms=paced_ms),
                       core=core, port=port, logs=logs, env=BASE_ENV, cwd=ROOT)
