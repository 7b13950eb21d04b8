"""Text embeddings behind one interface (implementations arrive with the retrieval work).

An :class:`Embedder` turns text into unit-length vectors of a fixed ``dimension``;
``embed_query`` is on the hot path (bounded by the recall deadline), ``embed_documents`` is
used when memories are written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Embedder(Protocol):
    model: str
    dimension: int

    async def embed_query(self, text: str) -> tuple[float, ...]: ...

    async def embed_documents(self, texts: Sequence[str]) -> list[tuple[float, ...]]: ...
