"""List routes answer values at the edges — cursors, limits, offsets, dates and day counts
of 0, negative, huge or not a number — alike on both backends: a 400 naming the
parameter, or a page (often empty); never a 503 for a value one store cannot express."""

from __future__ import annotations

from typing import Any

from tests.fakes import Gateway
from tests.routes.test_user_memory import ADMIN, U1, add, call, gw  # noqa: F401

EMPTY, PAGE = "empty", "page"  # 200 with no entry / with at least one entry
# (path, query, expected): expected is EMPTY, PAGE or the 400's param.
CASES: list[tuple[str, dict[str, str], str]] = [
    ("/v1/admin/audit", {"before": "0"}, EMPTY),
    ("/v1/admin/audit", {"before": "1"}, EMPTY),
    ("/v1/admin/audit", {"before": str(2**62)}, PAGE),
    ("/v1/admin/audit", {"before": "-1"}, "before"),
    ("/v1/admin/audit", {"before": str(2**63)}, "before"),
    ("/v1/admin/audit", {"before": "x"}, "before"),
    ("/v1/admin/audit", {"limit": "0"}, "limit"),
    ("/v1/admin/audit", {"limit": "1001"}, "limit"),
    ("/v1/admin/audit", {"limit": "1"}, PAGE),
    ("/v1/admin/audit", {"since": "0001-01-01T00:00:00Z"}, PAGE),
    ("/v1/admin/audit", {"since": "9999-12-31T23:59:59Z"}, EMPTY),
    ("/v1/admin/audit", {"since": "1969-01-01T00:00:00Z"}, PAGE),
    ("/v1/admin/audit", {"since": "x"}, "since"),
    ("/v1/admin/audit", {"until": "0001-01-01T00:00:00Z"}, EMPTY),
    ("/v1/admin/audit", {"until": "9999-12-31T23:59:59Z"}, PAGE),
    ("/v1/admin/usage", {"since": "0001-01-01"}, PAGE),
    ("/v1/admin/usage", {"since": "9999-12-31"}, EMPTY),
    ("/v1/admin/usage", {"until": "0001-01-01"}, EMPTY),
    ("/v1/admin/usage", {"since": "x"}, "since"),
    ("/v1/admin/usage", {"since": "2030-01-02", "until": "2030-01-01"}, "since"),
    ("/v1/admin/users", {"after": "zzz"}, EMPTY),
    ("/v1/admin/users", {"after": "0"}, PAGE),
    ("/v1/admin/users", {"limit": "0"}, "limit"),
    ("/v1/admin/users", {"limit": "501"}, "limit"),
    ("/v1/memories", {"after": "zzz"}, "after"),
    ("/v1/memories", {"after": "0"}, "after"),
    ("/v1/memories", {"after": "-1"}, "after"),
    ("/v1/memories", {"after": "01j8t4ra91tep1fe2dy5va9nwg"}, "after"),  # lower case
    ("/v1/memories", {"after": "8ZZZZZZZZZZZZZZZZZZZZZZZZZ"}, "after"),  # past 48 bits
    ("/v1/memories", {"after": "00000000000000000000000000"}, EMPTY),
    ("/v1/memories", {"after": "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"}, PAGE),
    ("/v1/memories", {"offset": "1000000"}, EMPTY),
    ("/v1/memories", {"offset": "-1"}, "offset"),
    ("/v1/memories", {"offset": "1000001"}, "offset"),
    ("/v1/memories", {"limit": "0"}, "limit"),
    ("/v1/memories", {"limit": "x"}, "limit"),
    ("/v1/admin/memories", {"after": "zzz"}, "after"),
    ("/v1/admin/memories", {"after": "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"}, PAGE),
    ("/v1/admin/memories", {"limit": "501"}, "limit"),
    ("/v1/admin/stats", {"days": "0"}, "days"),
    ("/v1/admin/stats", {"days": "367"}, "days"),
    ("/v1/admin/prompts/scoring/versions", {"limit": "0"}, "limit"),
]


def outcome(status: int, body: dict[str, Any]) -> str:
    if status == 200:
        return PAGE if body["data"] else EMPTY
    if status == 400 and body["error"]["code"] == "invalid_value":
        return str(body["error"]["param"])
    return f"{status} {body.get('error', {}).get('code')}"


async def test_edge_values_answer_alike_on_both_backends(gw: Gateway) -> None:  # noqa: F811
    """Every case of the table answers as the table says, on SQLite and on Redis."""
    await add(gw, "Likes green tea")  # one memory, one audit event, one known user
    async with gw.client(headers=ADMIN) as client:
        shared = await client.post("/v1/admin/memories", json={"content": "Opens at 9"})
        assert shared.status_code == 201, shared.text
    await call(
        gw,
        "POST",
        "/v1/chat/completions",
        U1,
        json={"model": "m", "messages": [{"role": "user", "content": "Hello"}]},
    )  # a usage row
    got = {}
    for path, params, _ in CASES:
        response = await call(
            gw, "GET", path, U1 if path == "/v1/memories" else ADMIN, params=params
        )
        got[(path, tuple(params.items()))] = outcome(response.status_code, response.json())
    assert got == {(path, tuple(params.items())): want for path, params, want in CASES}


async def test_a_memory_cursor_pages_and_a_bad_one_names_after(gw: Gateway) -> None:  # noqa: F811
    """The negative case beside the positive: ``after=<last_id>`` gives the next page; a
    value that is no memory id is a 400 with ``param: after`` and a message saying what
    to send, not the first page again."""
    for text in ("Likes green tea", "Plays the cello", "Keeps bees"):
        await add(gw, text)
    first = (await call(gw, "GET", "/v1/memories", U1, params={"limit": 2})).json()
    rest = (
        await call(gw, "GET", "/v1/memories", U1, params={"limit": 2, "after": first["last_id"]})
    ).json()
    assert [m["content"] for m in first["data"] + rest["data"]] == [
        "Keeps bees",
        "Plays the cello",
        "Likes green tea",
    ]
    bad = await call(gw, "GET", "/v1/memories", U1, params={"after": "zzz"})
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (
        "after",
        "invalid_value",
        "invalid_request_error",
    )
    assert "last_id" in error["message"]
