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

# Phrases of the libraries' built-in prompts, found as substrings of the detection form.
_PHRASES = (
    # instructor: re-asks (JSON, MD_JSON and tools modes) and its MD_JSON format request
    "correct your json only response", "correct your json response",
    "recall the function correctly", "validation error found:", "validation errors found:",
    "return the correct json response within a",
    # pydantic-ai: retry prompts
    "fix the errors and try again", "validation feedback:",
    "plain text responses are not permitted", "please include your response in a tool call",
    # LangChain output parsers and the output-fixing parser
    "is a well-formatted instance of the schema", "here is the output schema",
    "the output should be a markdown code snippet formatted in the following schema",
    "your response should be a list of comma separated values",
    "your response should be a numbered list", "your response should be a markdown list",
    "write a datetime string that matches the following pattern",
    "the completion did not satisfy the constraints given in the instructions",
    "only respond with an answer that satisfies the constraints",
    # llama-index structured_predict (its pydantic output parser)
    "here's a json schema to follow", "here\u2019s a json schema to follow",
    "output a valid json object but do not repeat the schema",
    # DSPy chat and JSON adapters
    "respond with the corresponding output fields", "[[ ## completed ## ]]",
    "respond with a json object in the following order of fields",
    # Guardrails
    "only return a valid json object (no other text is necessary)",
    "given below is xml that describes the information to extract",
    "help me correct this by making it valid json", "which was not parseable as json",
    # Vercel AI SDK, BAML
    "you must answer with json", "you must answer with a json",
    "answer in json using this schema",
)
# Each phrase filed under a word it holds: a form is searched for a group's phrases only
# when it holds that word (most text holds none of them).
_KEYWORDS = ("json", "schema", "validation", "recall", "fix the errors", "plain text",
             "tool call", "should be a", "datetime", "constraints", "output fields",
             "## completed", "xml")
_PHRASE_GROUPS = tuple(
    (word, tuple(p for p in _PHRASES if word in p and not any(
        earlier in p for earlier in _KEYWORDS[:index])))
    for index, word in enumerate(_KEYWORDS))
_FORMATS = ("json", "yaml", "xml", "csv")
# Patterns, each run only when the form holds one of its gate words.
_GATED: tuple[tuple[tuple[str, ...], re.Pattern[str]], ...] = (
    (("validation",), re.compile(r"\b\d+ validation errors?:")),
    (("formatted as",), re.compile(r"the output should be formatted as an? (?:json|yaml|xml)\b")),
    (("json schema:",), re.compile(r"^\W*json schema:\s*$", re.M)),
    # orders about the output's format, any client: "Return only valid JSON …"
    (_FORMATS, re.compile(
        r"^\W*(?:please\s+)?(?:return|respond|reply|answer|output|produce|generate|emit"
        r"|give me|format)\s+(?:with\s+|in\s+)?(?:(?:only|just|strictly|exactly|back)\s+)?"
        r"(?:(?:a|an|the|your)\s+)?(?:(?:valid|raw|pure|well-formed|correct|strict|proper"
        r"|single)\s+)*(?:json|yaml|xml|csv)\b", re.M)),
    (("schema",), re.compile(
        r"\b(?:matching|conforming\s+to|conforms?\s+to|that\s+matches|following)\s+the\s+"
        r"(?:(?:following|given|provided|above|below|json|output|response)\s+)*schema\b")),
    # an extraction order opening a line ("Extract the user details from this text",
    # instructor's "Extract Jason is 25 years old"): a task on a document, not the user
    (("extract",), re.compile(r"^\W*(?:please\s+)?extract\b", re.M)),
    ((" should ", " must ", " shall ", " has to ", " needs to ", " will "), re.compile(
        r"^\W*(?:your|the)\s+(?:response|output|answer|reply|result)s?\s+(?:should|must"
        r"|shall|has\s+to|needs\s+to|will)\s+(?:be|conform|follow|match|contain)\b", re.M)),
)


def marked(form: str) -> bool:
    """Whether a detection-form text holds scaffolding (the rule on one form)."""
    for word, phrases in _PHRASE_GROUPS:
        if word in form:
            for phrase in phrases:
                if phrase in form:
                    return True
    for gates, pattern in _GATED:
        for gate in gates:
            if gate in form:
                if pattern.search(form):
                    return True
                break
    return False


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
