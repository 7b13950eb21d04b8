"""Structured-output scaffolding is recognised: the re-asks and format instructions that
client libraries put in the user role are never the user's words (not learned, refused as
manual memories), while a user's own sentences about JSON or formats are kept.

None of these libraries is a test dependency, so their lines are quoted here, short, with
the library and the version they were read from.
"""

from __future__ import annotations

import pytest

from proxy.memory.directives import directive_rule, is_scaffolding, without_scaffolding

# (library and version, a line it sends in the user role); ``{…}`` marks where the library
# puts the validation error, schema or field names.
LIBRARY_LINES: list[tuple[str, str]] = [
    ("instructor 1.7 (JSON/MD_JSON re-ask)",
     "Correct your JSON ONLY RESPONSE, based on the following errors:\n"
     "1 validation error for UserDetail\nage\n  Field required"),
    ("instructor 1.2 (tools re-ask)",
     "Recall the function correctly, fix the errors and exceptions found\n"
     "1 validation error for UserDetail"),
    ("instructor 1.7 (tools re-ask)",
     "Validation Error found:\n1 validation error for UserDetail\n"
     "Recall the function correctly, fix the errors"),
    ("instructor 1.7 (Anthropic JSON re-ask)",
     "Validation Errors found:\nage: field required\nRecall the function correctly, fix "
     "the errors found in the following attempt:\n{\"name\": \"Jason\"}"),
    ("instructor 1.7 (MD_JSON format request)",
     "Return the correct JSON response within a ```json codeblock. not the JSON_SCHEMA"),
    ("instructor 1.7 (README example)", "Extract Jason is 25 years old"),
    ("pydantic-ai 0.4 (output validator retry)",
     "Validation feedback:\nThe city must be in Europe\n\nFix the errors and try again."),
    ("pydantic-ai 0.4 (schema validation retry)",
     "1 validation errors: [{\"type\": \"missing\", \"loc\": [\"age\"]}]\n\n"
     "Fix the errors and try again."),
    ("pydantic-ai 0.2 (text instead of a tool call)",
     "Plain text responses are not permitted, please include your response in a tool call"),
    ("langchain-core 0.3 (PydanticOutputParser / JsonOutputParser)",
     "The output should be formatted as a JSON instance that conforms to the JSON schema "
     "below.\n\nHere is the output schema:\n```\n{\"properties\": {}}\n```"),
    ("langchain-core 0.3 (format instructions example)",
     "the object {\"foo\": [\"bar\", \"baz\"]} is a well-formatted instance of the schema."),
    ("langchain 0.3 (StructuredOutputParser)",
     "The output should be a markdown code snippet formatted in the following schema, "
     "including the leading and trailing \"```json\" and \"```\":"),
    ("langchain-core 0.3 (CommaSeparatedListOutputParser)",
     "Your response should be a list of comma separated values, eg: `foo, bar, baz`"),
    ("langchain-core 0.3 (NumberedListOutputParser)",
     "Your response should be a numbered list with each item on a new line."),
    ("langchain-core 0.3 (MarkdownListOutputParser)",
     "Your response should be a markdown list, eg: `- foo\n- bar\n- baz`"),
    ("langchain 0.3 (DatetimeOutputParser)",
     "Write a datetime string that matches the following pattern: '%Y-%m-%dT%H:%M:%S.%fZ'."),
    ("langchain 0.3 (YamlOutputParser)",
     "The output should be formatted as a YAML instance that conforms to the given JSON "
     "schema below."),
    ("langchain 0.3 (OutputFixingParser)",
     "Above, the Completion did not satisfy the constraints given in the Instructions."),
    ("llama-index-core 0.12 (structured_predict, PydanticOutputParser)",
     "Here's a JSON schema to follow:\n{\"properties\": {}}\n\n"
     "Output a valid JSON object but do not repeat the schema."),
    ("dspy 2.6 (ChatAdapter)",
     "Respond with the corresponding output fields, starting with the field "
     "`[[ ## answer ## ]]`, and then ending with the marker for `[[ ## completed ## ]]`."),
    ("dspy 2.6 (JSONAdapter)",
     "Respond with a JSON object in the following order of fields: `answer`."),
    ("guardrails-ai 0.5 (JSON suffix)",
     "ONLY return a valid JSON object (no other text is necessary), where the key of the "
     "field in JSON is the `name` attribute of the corresponding XML"),
    ("guardrails-ai 0.5 (instructions)",
     "Given below is XML that describes the information to extract from this document and "
     "the tags to extract it into."),
    ("guardrails-ai 0.5 (re-ask)",
     "I was given the following response, which was not parseable as JSON.\n\n{\"a\": 1\n\n"
     "Help me correct this by making it valid JSON."),
    ("ai (Vercel AI SDK) 4.x (generateObject, JSON mode)",
     "JSON schema:\n{\"type\": \"object\"}\n"
     "You MUST answer with a JSON object that matches the JSON schema above."),
    ("baml 0.7x (ctx.output_format)",
     "Answer in JSON using this schema:\n{\n  name: string,\n}"),
    ("any client (a format order)", "Return only valid JSON matching the schema"),
    ("any client (an extraction order)", "Extract the user details from this text"),
]

# A user's own words about JSON, schemas or formats: kept.
USER_LINES = [
    "I work on JSON schema validation at my job.",
    "Prefers answers in JSON format",
    "My response to errors is usually to add a test first.",
    "The format of our weekly report changed last month.",
    "Extracted data from PDFs for a research project",
    "I return home at six most days.",
    "我们团队用 JSON 存配置",
]


def test_the_table_is_large() -> None:
    """At least 20 library lines, from at least six libraries."""
    assert len(LIBRARY_LINES) >= 20
    assert len({source.split()[0] for source, _ in LIBRARY_LINES}) >= 6


@pytest.mark.parametrize(("source", "line"), LIBRARY_LINES,
                         ids=[source for source, _ in LIBRARY_LINES])
def test_library_lines_are_scaffolding(source: str, line: str) -> None:
    """Each library line is scaffolding, refused as a memory, and nothing of it is left
    for the learning model."""
    assert is_scaffolding(line), source
    assert directive_rule(line) == "order", source
    assert without_scaffolding(line) == "", source


@pytest.mark.parametrize("line", USER_LINES)
def test_the_users_own_words_are_not_scaffolding(line: str) -> None:
    """Sentences that mention JSON, schemas, formats or extraction are kept as written."""
    assert not is_scaffolding(line)
    assert without_scaffolding(line) == line
    assert directive_rule(line) is None


def test_appended_format_instructions_are_cut_off() -> None:
    """The user's words before a library's appended instructions are kept, the rest cut."""
    _, instructions = LIBRARY_LINES[9]
    assert without_scaffolding(f"I live in Lisbon.\n\n{instructions}") == "I live in Lisbon."
    assert without_scaffolding("I live in Lisbon.") == "I live in Lisbon."
