"""The learning model's answers: finding JSON in its text, and the scoring and extraction
answers as validated models.

* :mod:`.json_text` - the JSON value in model text (:func:`extract_json`,
  :func:`parse_model_json`), with :mod:`.reasoning` (reasoning blocks cut out) and
  :mod:`.json_scan` (cut-off documents);
* :mod:`.scoring` - :func:`parse_scoring`, the :class:`.scoring.ScoringAnswer` model and
  the schema generated from it;
* :mod:`.extraction` - :func:`parse_extraction`, with the models of :mod:`.models`, the
  field readers of :mod:`.fields` and the records of :mod:`.results` it returns;
* :mod:`.verdict` - :func:`parse_verdict`, same or different for two profile wordings;
* :mod:`.schema` - a pydantic model's schema in the plain form sent to the model.
"""

from proxy.learning.answers.extraction import EXTRACTION_SCHEMA, parse_extraction
from proxy.learning.answers.json_text import extract_json, parse_model_json
from proxy.learning.answers.output import ModelOutput, ParseError
from proxy.learning.answers.reasoning import strip_reasoning
from proxy.learning.answers.results import (
    IMAGE_TIERS,
    CandidateFact,
    ExtractionResult,
    ImageVerdict,
    ProfileUpdate,
)
from proxy.learning.answers.scoring import SCORE_WEIGHTS, SCORING_SCHEMA, ScoreResult, parse_scoring
from proxy.learning.answers.verdict import VERDICT_SCHEMA, parse_verdict
from proxy.memory.categories import CATEGORIES

__all__ = [
    "CATEGORIES",
    "EXTRACTION_SCHEMA",
    "IMAGE_TIERS",
    "SCORE_WEIGHTS",
    "SCORING_SCHEMA",
    "VERDICT_SCHEMA",
    "CandidateFact",
    "ExtractionResult",
    "ImageVerdict",
    "ModelOutput",
    "ParseError",
    "ProfileUpdate",
    "ScoreResult",
    "extract_json",
    "parse_extraction",
    "parse_model_json",
    "parse_scoring",
    "parse_verdict",
    "strip_reasoning",
]
