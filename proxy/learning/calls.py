"""The two learning-model calls of a batch: scoring and extraction.

Each call shows the newest messages of the batch that fit the learning model's context
window beside its prompt and a reply of ``max_tokens`` (:meth:`ModelCalls.fit`). A batch's
score is kept for its retries (up to :data:`SCORE_CACHE_SIZE` batches), so a failed
extraction is not scored again. A retried extraction gets twice the room to answer while
that room still shows the model the same messages.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

import structlog

from proxy.errors import MemoryProxyError
from proxy.learning.answers import ExtractionResult, ScoreResult, parse_extraction, parse_scoring
from proxy.learning.events import Counter, batch_event
from proxy.learning.model import LearningModel
from proxy.learning.prompts import (
    EXTRACTION_SCHEMA,
    SCORING_SCHEMA,
    Language,
    batch_images,
    extraction_messages,
    fit_batch,
    scoring_messages,
)
from proxy.learning.queue import Batch, Job
from proxy.learning.tenancy import TenantLearning
from proxy.memory.store import AuditEvent, MemoryStore
from proxy.request import Message
from proxy.tokens import IMAGE_TOKENS

log = structlog.get_logger("proxy.learning")
SCORE_CACHE_SIZE = 1024  # batches whose score is kept for their retries
SCORING_MAX_TOKENS = 512  # the scoring reply: one small JSON object


class LearningWindowTooSmall(MemoryProxyError):
    """The learning prompt and its reply fill the learning model's context window: the
    model would see none of the conversation. The attempt fails (retried, then
    dead-lettered with the transcript kept for a requeue once ``learning.model`` or
    ``learning.max_output_tokens`` is fixed) instead of a call that cannot learn."""


@dataclass(frozen=True, slots=True)
class Extracted:
    """The extraction's answer; whether the batch's images went with the call; the part
    of the batch the model was shown (its images are the ones numbered); the audit
    events of the call (images skipped by a model that does not see them)."""

    extraction: ExtractionResult
    vision: bool
    shown: Batch
    audit: tuple[AuditEvent, ...]


class ModelCalls:
    """Scoring and extraction calls, with the score cache."""

    def __init__(self, *, store: MemoryStore, tenancy: TenantLearning,
                 base_model: LearningModel, count: Counter) -> None:
        self._store = store
        self._tenancy = tenancy
        self._base_model = base_model
        self._count = count
        self._scores: OrderedDict[str, ScoreResult] = OrderedDict()

    def forget(self, batch_key: str) -> None:
        """The batch is applied: its score is not needed again."""
        self._scores.pop(batch_key, None)

    async def score(self, job: Job, batch: Batch, known_text: str,
                    language: Language, model: LearningModel) -> ScoreResult:
        """The batch's score; a retry after a failed extraction keeps the earlier one."""
        scored = self._scores.get(batch.key)
        if scored is None:
            override = await self._tenancy.prompt(batch.tenant, "scoring")

            def build(part: Batch) -> list[Message]:
                return scoring_messages(batch=part, known=known_text, language=language,
                                        override=override)

            _, messages = self.fit(batch, build, max_tokens=SCORING_MAX_TOKENS, model=model)
            scored = parse_scoring(await model.call(
                purpose="score", request_model=batch.model, tenant=batch.tenant,
                user=batch.user, job_id=job.id, max_tokens=SCORING_MAX_TOKENS,
                schema=SCORING_SCHEMA, messages=messages,
            ))
            self._scores[batch.key] = scored
            while len(self._scores) > SCORE_CACHE_SIZE:
                self._scores.popitem(last=False)
        return scored

    async def extract(self, job: Job, batch: Batch, *, known_text: str, language: Language,
                      group: bool, now: datetime, model: LearningModel) -> Extracted:
        """The extraction call (with the conversation's earlier summary, and the images when
        the learning model sees them); ``group``: the group prompt (facts by speaker)."""
        shared = batch_images(batch)
        vision = bool(shared) and model.sees_images(batch.model)
        audit: list[AuditEvent] = []
        if shared and not vision:
            audit.append(batch_event(batch, "skipped", "images: the learning model does not "
                                     "accept image input", now, {"images": len(shared)}))
            self._count("images", "skipped_no_vision")
        previous = await self._store.get_conversation(batch.tenant, batch.user,
                                                      batch.conversation)
        override = await self._tenancy.prompt(batch.tenant, "extraction")
        max_tokens = self._tenancy.settings.max_output_tokens

        def build(part: Batch) -> list[Message]:
            return extraction_messages(batch=part, known=known_text, language=language,
                                       override=override, group=group, vision=vision,
                                       earlier=previous.summary if previous else "")

        shown, messages = self.fit(batch, build, max_tokens=max_tokens, vision=vision,
                                   model=model)
        if job.attempts > 1:
            # A retry may have failed on a reply cut at max_tokens: it gets twice the room
            # to answer, but only while that room shows the model the same messages as the
            # first attempt did — never a shorter (or empty) transcript.
            wider = self.fit(batch, build, max_tokens=2 * max_tokens, vision=vision,
                             model=model, quiet=True)
            if len(wider[0].messages) == len(shown.messages):
                max_tokens = 2 * max_tokens
                shown, messages = wider
        extraction = parse_extraction(await model.call(
            purpose="extract", request_model=batch.model, tenant=batch.tenant,
            user=batch.user, job_id=job.id, max_tokens=max_tokens, schema=EXTRACTION_SCHEMA,
            messages=messages,
        ))
        return Extracted(extraction, vision, shown, tuple(audit))

    def fit(self, batch: Batch, build: Callable[[Batch], list[Message]], *,
            max_tokens: int, vision: bool = False,
            model: LearningModel | None = None,
            quiet: bool = False) -> tuple[Batch, list[Message]]:
        """The part of ``batch`` a learning call shows and the call's messages (``build``):
        the newest messages that fit the learning model's context window once the prompt
        without them and a reply of ``max_tokens`` are counted (:func:`fit_batch`).
        ``quiet``: a trial fit, neither counted, logged nor raised. Raises
        :class:`LearningWindowTooSmall` when none of a non-empty batch fits."""
        model = model or self._base_model
        room = model.room(batch.model, build(replace(batch, messages=())),
                          max_tokens=max_tokens)
        shown = fit_batch(batch, budget=room,
                          count=lambda text: model.count(batch.model, text),
                          image_tokens=IMAGE_TOKENS if vision else 0)
        if shown is not batch and not quiet:
            self._count("transcript_cut", "window")
            log.info("learning_transcript_cut", batch=batch.key, room_tokens=room,
                     messages=len(batch.messages), shown=len(shown.messages))
            if batch.messages and not shown.messages:
                self._too_small(batch, model, room=room, max_tokens=max_tokens)
        return shown, build(shown)

    def _too_small(self, batch: Batch, model: LearningModel, *, room: int,
                   max_tokens: int) -> None:
        """The prompt and the reply alone fill the window: the model sees nothing to learn
        from — a configuration problem (``learning.model`` / ``max_output_tokens``).
        Counted, logged, and raised as :class:`LearningWindowTooSmall`."""
        self._count("transcript_cut", "window_too_small")
        log.warning("learning_window_too_small", batch=batch.key,
                    model=model.model_for(batch.model), room_tokens=room,
                    max_tokens=max_tokens,
                    detail="the learning model's context window leaves no room for "
                           "the conversation: pick a larger learning.model or lower "
                           "learning.max_output_tokens")
        raise LearningWindowTooSmall(
            f"the learning model {model.model_for(batch.model)!r} has room for none "
            f"of the conversation ({room} tokens left beside the prompt and a "
            f"{max_tokens}-token reply): pick a larger learning.model or lower "
            "learning.max_output_tokens, then requeue")
