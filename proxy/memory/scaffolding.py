"""Machine-written scaffolding: the prompts structured-output libraries put in the user
role (pure).

Clients that ask for structured output (instructor, pydantic-ai, LangChain output parsers,
llama-index ``structured_predict``, DSPy, Guardrails, the Vercel AI SDK, BAML) send their
own text as a *user* message on every call or retry: re-asks after a validation error
("Correct your JSON ONLY RESPONSE, based on the following errors: …", "Validation
feedback: … Fix the errors and try again."), format instructions ("The output should be
formatted as a JSON instance that conforms to the JSON schema below.", "Here's a JSON
schema to follow: …") and extraction orders ("Extract the user details from this text").
None of it is the user's words: it is never learned (:func:`without_scaffolding` cuts it
out of the transcript the learning model reads) and never stored as memory
(:func:`is_scaffolding`, one of the rules of :mod:`proxy.memory.directives`).

The markers are short, stable phrases of those libraries' built-in prompts, matched on the
detection form (:func:`~proxy.memory.text.detection_form`: case-folded, full-width and
look-alike letters mapped), plus orders about the output's format in general ("Return only
valid JSON matching the schema", "Respond with a JSON object"). A statement of the user's
preference about answers ("Prefers answers in JSON format") is none of these.
"""

from __future__ import annotations

import re

from proxy.memory.text import detection_form

_MARKERS = re.compile(
    # instructor: re-asks (JSON, MD_JSON and tools modes) and its MD_JSON format request
    r"correct your json (?:only )?response"
    r"|recall the function correctly"
    r"|validation errors? found:"
    r"|return the correct json response within a"
    # pydantic-ai: retry prompts
    r"|fix the errors and try again"
    r"|validation feedback:"
    r"|\b\d+ validation errors?:"
    r"|plain text responses are not permitted"
    r"|please include your response in a tool call"
    # LangChain output parsers and the output-fixing parser
    r"|the output should be formatted as an? (?:json|yaml|xml)\b"
    r"|is a well-formatted instance of the schema"
    r"|here is the output schema"
    r"|the output should be a markdown code snippet formatted in the following schema"
    r"|your response should be a (?:list of comma separated values|numbered list"
    r"|markdown list)"
    r"|write a datetime string that matches the following pattern"
    r"|the completion did not satisfy the constraints given in the instructions"
    r"|only respond with an answer that satisfies the constraints"
    # llama-index structured_predict (its pydantic output parser)
    r"|here['’]s a json schema to follow"
    r"|output a valid json object but do not repeat the schema"
    # DSPy chat and JSON adapters
    r"|respond with the corresponding output fields"
    r"|\[\[ ## completed ## \]\]"
    r"|respond with a json object in the following order of fields"
    # Guardrails
    r"|only return a valid json object \(no other text is necessary\)"
    r"|given below is xml that describes the information to extract"
    r"|help me correct this by making it valid json"
    r"|which was not parseable as json"
    # Vercel AI SDK, BAML
    r"|you must answer with (?:a )?json\b"
    r"|^\W*json schema:\s*$"
    r"|answer in json using this schema"
    # orders about the output's format, any client
    r"|^\W*(?:please\s+)?(?:return|respond|reply|answer|output|produce|generate|emit|give me"
    r"|format)\s+(?:with\s+|in\s+)?(?:(?:only|just|strictly|exactly|back)\s+)?"
    r"(?:(?:a|an|the|your)\s+)?(?:(?:valid|raw|pure|well-formed|correct|strict|proper|single)"
    r"\s+)*(?:json|yaml|xml|csv)\b"
    r"|\b(?:matching|conforming\s+to|conforms?\s+to|that\s+matches|following)\s+the\s+"
    r"(?:(?:following|given|provided|above|below|json|output|response)\s+)*schema\b"
    # an extraction order opening a line ("Extract the user details from this text",
    # instructor's "Extract Jason is 25 years old"): a task on a document, not the user
    r"|^\W*(?:please\s+)?extract\b"
    r"|^\W*(?:your|the)\s+(?:response|output|answer|reply|result)s?\s+(?:should|must|shall|has"
    r"\s+to|needs\s+to|will)\s+(?:be|conform|follow|match|contain)\b",
    re.M,
)
# Cheap gate: every marker holds one of these.
_GATE = ("json", "schema", "error", "format", "extract", "recall", "respond", "output",
         "field", "completion", "constraint", "tool call", "plain text", "list", "xml",
         "yaml", "csv", "datetime", "response", "answer", "return", "reply", "validation",
         "parseable", "completed")


def marked(form: str) -> bool:
    """Whether a detection-form text holds scaffolding (the rule on one form)."""
    return any(word in form for word in _GATE) and _MARKERS.search(form) is not None


def is_scaffolding(text: str) -> bool:
    """Whether ``text`` holds a structured-output library's scaffolding or an order about
    the output's format (see the module docstring); decided on its detection form."""
    return marked(detection_form(text))


def without_scaffolding(text: str) -> str:
    """``text`` as the user wrote it: cut before its first line that holds scaffolding
    (libraries append their format instructions after the user's words, and a re-ask is
    scaffolding from its first line). ``""`` when nothing of the user's remains; ``text``
    itself when it holds no scaffolding."""
    form = detection_form(text)
    if not marked(form):
        return text
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if marked(detection_form(line)):
            return "".join(lines[:index]).strip()
    return ""  # the marker spans lines: the whole message is scaffolding
