"""README's "Keys for a local trial": the snippet, exactly as printed, starts a gateway on
which every README example reaches what it shows.

The YAML block and the ``export`` line are read from README.md by their markers, so an edit
of the README is what is tested. The gateway is the one the snippet configures (loaded by
``load_settings`` from the file, keys from the environment); only the ``local`` model's
``api_base`` is turned to the fake upstream. The README's curl commands (quick start, "Your
users' memory", the admin API) are replayed as curl would send them — method, headers, body
and its form content type, with the README's shell variables — and each must be answered,
not refused; the same command without its key is a 401. The "Memory without a model"
block also runs in open mode on the shipped ``config.yaml`` (what ``./scripts/serve`` reads),
with no model reachable.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from proxy.settings import Settings, load_settings
from tests.fakes import UPSTREAM_BASE, FakeUpstream, Gateway, running_gateway

README = Path(__file__).resolve().parents[1] / "README.md"
CONFIG_MARK = "<!-- keys-for-a-local-trial -->"
START_MARK = "<!-- keys-for-a-local-trial-start -->"
# The README's gateway address in its examples.
README_ORIGIN = re.compile(r"(?:http://)?(?:localhost|127\.0\.0\.1):8080")
# A placeholder id the reader replaces ("01JB…", "01J..."): such a call may be a 404.
PLACEHOLDER = re.compile(r"01J\w*(?:…|\.\.\.)")


def block_after(text: str, marker: str, language: str) -> str:
    """The body of the first ```language fence after ``marker``; ValueError without one."""
    at = text.find(marker)
    if at < 0:
        raise ValueError(f"README has no {marker}")
    found = re.compile(rf"```{language}\n(.*?)```", re.DOTALL).search(text, at)
    if found is None:
        raise ValueError(f"no ```{language} block after {marker}")
    return found.group(1)


def exports(bash: str) -> dict[str, str]:
    """``NAME=value`` pairs of the block's ``export`` lines."""
    out: dict[str, str] = {}
    for line in bash.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            out.update(word.split("=", 1) for word in words[1:])  # type: ignore[arg-type]
    return out


def env_references(yaml_text: str) -> set[str]:
    return set(re.findall(r"os\.environ/(\w+)", yaml_text))


def key_variables(text: str) -> set[str]:
    """Shell variables that README examples send as a bearer key."""
    return set(re.findall(r"Bearer \$(\w+)", text))


@dataclass
class Curl:
    """One curl command as curl would send it."""

    method: str
    url: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None
    save_to: str | None = None

    @property
    def has_key(self) -> bool:
        return any(name.lower() == "authorization" for name, _ in self.headers)


def _expand(line: str, variables: dict[str, str], arrays: dict[str, str]) -> str:
    for name, words in arrays.items():
        line = line.replace(f'"${{{name}[@]}}"', words)
    # ${NAME:+words}: the words when NAME is set and not empty, else nothing (as bash)
    line = re.sub(r"\$\{(\w+):\+([^}]*)\}",
                  lambda m: m.group(2) if variables.get(m.group(1)) else "", line)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), line)


def _filtered(reply: httpx.Response, words: list[str]) -> str | None:
    """What ``curl … | python3 -c CODE`` prints: CODE run on the reply's body by this
    interpreter; None when it fails (a refused call has no id to print)."""
    if words[:2] != ["python3", "-c"] or len(words) != 3:
        raise ValueError(f"a captured command pipes into python3 -c CODE, not {words}")
    done = subprocess.run([sys.executable, "-c", words[2]], input=reply.content,
                          capture_output=True, timeout=30, check=False)
    return done.stdout.decode().strip() if done.returncode == 0 else None


def _curl(words: list[str], files: dict[str, bytes]) -> Curl:
    method, url, headers, body, save_to = None, "", [], None, None
    it = iter(words[1:])
    for word in it:
        if word in ("|", ">"):
            save_to = next(it) if word == ">" else None
            break
        if word == "-X":
            method = next(it)
        elif word == "-H":
            name, _, value = next(it).partition(":")
            headers.append((name.strip(), value.strip()))
        elif word in ("-d", "--data"):
            data = next(it)
            body = files[data[1:]] if data.startswith("@") else data.encode()
        elif not word.startswith("-"):
            url = word
    if body is not None and not any(n.lower() == "content-type" for n, _ in headers):
        headers.append(("Content-Type", "application/x-www-form-urlencoded"))  # curl's -d
    return Curl(method or ("POST" if body is not None else "GET"), url, headers, body, save_to)


def readme_curls(text: str, variables: dict[str, str]) -> list[list[str]]:
    """Each README bash block that calls the gateway, as lists of shell lines (continuations
    joined, comments kept for shlex to drop)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    return [
        block.replace("\\\n", " ").splitlines()
        for block in blocks
        if "curl " in block and README_ORIGIN.search(block)
    ]


async def replay(
    lines: list[str],
    client: httpx.AsyncClient,
    variables: dict[str, str],
    *,
    strip_key: bool = False,
    add_key: str | None = None,
) -> list[tuple[Curl, httpx.Response]]:
    """Run a README block's assignments and curl commands against ``client``."""
    variables, arrays, files = dict(variables), {}, {}
    answered = []
    for raw in lines:
        line = _expand(raw, variables, arrays)
        if (array := re.match(r"^(\w+)=\((.*)\)\s*$", line)) is not None:
            arrays[array.group(1)] = array.group(2)
            continue
        if (captured := re.match(r"^(\w+)=\$\((.*)\)\s*$", line)) is not None:
            words = shlex.split(captured.group(2))
            curl, reply = await _send(_curl(words, files), client, strip_key, add_key)
            answered.append((curl, reply))
            value = _filtered(reply, words[words.index("|") + 1:])
            if value is not None:  # else left unset: later commands carry "$NAME" as is,
                variables[captured.group(1)] = value  # so their routes still judge the key
            continue
        if (scalar := re.match(r"^(\w+)=(\S.*)$", line)) is not None:
            variables[scalar.group(1)] = shlex.split(scalar.group(2))[0]
            continue
        words = shlex.split(line, comments=True)
        if words[:1] != ["curl"]:
            continue
        curl, reply = await _send(_curl(words, files), client, strip_key, add_key)
        if curl.save_to is not None:
            files[curl.save_to] = reply.content
        answered.append((curl, reply))
    return answered


async def _send(
    curl: Curl, client: httpx.AsyncClient, strip_key: bool, add_key: str | None
) -> tuple[Curl, httpx.Response]:
    if strip_key:
        curl.headers = [h for h in curl.headers if h[0].lower() != "authorization"]
    elif add_key is not None and not curl.has_key:
        curl.headers.append(("Authorization", f"Bearer {add_key}"))
    reply = await client.request(
        curl.method, README_ORIGIN.sub("", curl.url), headers=curl.headers, content=curl.body
    )
    return curl, reply


# ------------------------------------------------------------------------- fixtures


@pytest.fixture
def readme() -> str:
    return README.read_text(encoding="utf-8")


@pytest.fixture
def trial_keys(readme: str) -> dict[str, str]:
    return exports(block_after(readme, START_MARK, "bash"))


@pytest.fixture
def trial_settings(
    readme: str, trial_keys: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The snippet saved as trial.yaml and loaded as ``serve --config trial.yaml`` would,
    from a fresh directory, with the exported keys; ``local`` points at the fake."""
    config = tmp_path / "trial.yaml"
    config.write_text(block_after(readme, CONFIG_MARK, "yaml"), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for name, value in trial_keys.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(config)
    models = [
        d.model_copy(
            update={
                "litellm_params": d.litellm_params.model_copy(update={"api_base": UPSTREAM_BASE})
            }
        )
        if d.model_name == "local"
        else d
        for d in settings.model_list
    ]
    return settings.model_copy(update={"model_list": models})


@pytest.fixture
async def trial(trial_settings: Settings) -> AsyncIterator[Gateway]:
    async with running_gateway(trial_settings, FakeUpstream()) as gw:
        yield gw


def bearer(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


# ---------------------------------------------------------------------------- tests


def test_the_snippet_exports_every_key_it_configures_and_the_readme_sends(
    readme: str, trial_keys: dict[str, str]
) -> None:
    """Each ``os.environ/NAME`` key of the snippet is exported by its start line, and each
    ``Bearer $NAME`` of a README example is one of them (OPENAI_API_KEY is the upstream's,
    optional)."""
    configured = env_references(block_after(readme, CONFIG_MARK, "yaml")) - {"OPENAI_API_KEY"}
    assert configured == {"APP_KEY", "ALICE_KEY", "ACME_ADMIN_KEY", "GLOBAL_KEY"}
    assert configured <= set(trial_keys)
    assert key_variables(readme) <= set(trial_keys)


def test_the_key_check_sees_a_variable_the_snippet_lacks() -> None:
    """A README example sending a key the snippet never exports is caught."""
    text = 'curl -H "Authorization: Bearer $OTHER_KEY"\n```bash\nexport APP_KEY=x\n```'
    assert key_variables(text) - set(exports("export APP_KEY=x")) == {"OTHER_KEY"}


def test_a_missing_marker_is_an_error_not_an_empty_snippet() -> None:
    with pytest.raises(ValueError, match="keys-for-a-local-trial"):
        block_after("no snippet here", CONFIG_MARK, "yaml")


async def test_the_app_key_chats_for_the_user_it_names(
    trial: Gateway, trial_keys: dict[str, str]
) -> None:
    """Chat with the app key and X-User-Id is alice's chat; without a user it is plain
    pass-through, and without a key a 401."""
    body = {"model": "local", "messages": [{"role": "user", "content": "Hi"}]}
    async with trial.client() as http:
        named = await http.post(
            "/v1/chat/completions",
            json=body,
            headers=bearer(trial_keys["APP_KEY"], **{"X-User-Id": "alice"}),
        )
        anonymous = await http.post(
            "/v1/chat/completions", json=body, headers=bearer(trial_keys["APP_KEY"])
        )
        keyless = await http.post("/v1/chat/completions", json=body)
    assert named.status_code == 200
    assert named.json()["choices"][0]["message"]["content"] == "Hello there!"
    assert named.headers["x-memory-status"] == "empty"
    assert anonymous.headers["x-memory-status"] == "no_user"
    assert keyless.status_code == 401
    assert keyless.json()["error"]["type"]


async def test_each_key_is_the_role_the_readme_gives_it(
    trial: Gateway, trial_keys: dict[str, str]
) -> None:
    """GET /v1/me (what the console asks at sign-in): the user-bound key is alice whatever
    the header says, the admin key is acme's admin, the global key the global admin."""
    async with trial.client() as http:
        alice = await http.get(
            "/v1/me", headers=bearer(trial_keys["ALICE_KEY"], **{"X-User-Id": "bob"})
        )
        admin = await http.get("/v1/me", headers=bearer(trial_keys["ACME_ADMIN_KEY"]))
        root = await http.get("/v1/me", headers=bearer(trial_keys["GLOBAL_KEY"]))
        wrong = await http.get("/v1/me", headers=bearer("not-a-trial-key"))
    assert (alice.json()["user"], alice.json()["role"], alice.json()["tenant"]) == (
        "alice",
        "user",
        "acme",
    )
    assert (admin.json()["role"], admin.json()["tenant"]) == ("admin", "acme")
    assert root.json()["role"] == "global_admin"
    assert wrong.status_code == 401


async def test_admin_routes_open_to_the_admin_keys_only(
    trial: Gateway, trial_keys: dict[str, str]
) -> None:
    """The admin key reads acme's stats, the global key names the tenant; the app and the
    user-bound key are refused there, and the global key cannot chat."""
    async with trial.client() as http:
        admin = await http.get(
            "/v1/admin/stats?days=7", headers=bearer(trial_keys["ACME_ADMIN_KEY"])
        )
        root = await http.get(
            "/v1/admin/stats?tenant=acme", headers=bearer(trial_keys["GLOBAL_KEY"])
        )
        refused = [
            await http.get("/v1/admin/stats?days=7", headers=bearer(trial_keys[name]))
            for name in ("APP_KEY", "ALICE_KEY")
        ]
        chat = await http.post(
            "/v1/chat/completions",
            headers=bearer(trial_keys["GLOBAL_KEY"]),
            json={"model": "local", "messages": [{"role": "user", "content": "Hi"}]},
        )
    assert admin.status_code == 200
    assert root.status_code == 200
    assert [r.status_code for r in refused] == [403, 403]
    assert chat.status_code == 403


async def test_the_readme_curls_are_answered_with_their_keys(
    readme: str, trial: Gateway, trial_keys: dict[str, str]
) -> None:
    """Every README curl against the gateway, in README order on a fresh store, with the
    snippet's keys (the quick start's, which show open mode, with the app key as the README
    says): each answered 2xx, never 401/403/404/5xx — every id it uses was made by an
    earlier command (``ID=$(curl … | python3 -c …)``), every prompt version it restores
    saved before. Writes land where the README says."""
    blocks = readme_curls(readme, trial_keys)
    assert len(blocks) >= 3
    answered = []
    async with trial.client() as http:
        for lines in blocks:
            answered += await replay(lines, http, trial_keys, add_key=trial_keys["APP_KEY"])
        shared = await http.get(
            "/v1/admin/memories?scope=shared", headers=bearer(trial_keys["ACME_ADMIN_KEY"])
        )
        prompt = await http.get(
            "/v1/admin/prompts/extraction", headers=bearer(trial_keys["ACME_ADMIN_KEY"])
        )
    assert len(answered) >= 20
    for curl, reply in answered:
        assert not PLACEHOLDER.search(curl.url), curl.url
        assert reply.status_code in {200, 201, 202}, (curl, reply.status_code, reply.text[:300])
    contents = [m["content"] for m in shared.json()["data"]]
    assert "Expense reports are due on Fridays" in contents
    assert "The VPN client is set up through the help desk portal" in contents  # promoted
    versions = prompt.json()["versions"]
    assert [v["version"] for v in versions] == [4, 3, 2, 1]
    assert versions[1]["text"] == versions[3]["text"] != ""  # 3 restored 1
    assert prompt.json()["source"].startswith("built-in")  # 4: back to the built-in


async def test_a_placeholder_id_in_a_curl_is_caught(trial: Gateway) -> None:
    """A README curl naming an id the reader would have to replace (``01JB…``) is what the
    check above refuses, and it answers 404 on a fresh store."""
    lines = ['curl -s -X PATCH localhost:8080/v1/memories/01JB… -H "X-User-Id: alice" '
             "-d '{\"enabled\": false}'"]
    async with trial.client() as http:
        [(curl, reply)] = await replay(lines, http, {}, add_key="trial-app")
    assert PLACEHOLDER.search(curl.url)
    assert reply.status_code == 404


async def test_a_captured_id_is_unset_when_the_command_failed(trial: Gateway) -> None:
    """``ID=$(curl … | python3 -c …)`` holds what the filter printed; a refused call (no
    key: 401) leaves it unset, and the next command, refused too, names no id."""
    lines = ["ID=$(curl -s localhost:8080/v1/memories -H 'X-User-Id: alice' "
             "-d '{\"content\": \"Likes tea\"}' "
             "| python3 -c 'import json, sys; print(json.load(sys.stdin)[\"id\"])')",
             "curl -s localhost:8080/v1/memories/$ID -H 'X-User-Id: alice'"]
    async with trial.client() as http:
        made = await replay(lines, http, {}, add_key="trial-app")
        refused = await replay(lines, http, {}, strip_key=True)
    assert made[0][1].status_code == 201
    assert made[1][0].url.endswith(made[0][1].json()["id"])
    assert made[1][1].json()["content"] == "Likes tea"
    assert [reply.status_code for _, reply in refused] == [401, 401]
    assert refused[1][0].url.endswith("/v1/memories/$ID")


async def test_the_readme_curls_without_their_keys_are_refused(
    readme: str, trial: Gateway, trial_keys: dict[str, str]
) -> None:
    """The same commands with the key left out: every one a 401 in OpenAI's error shape."""
    answered = []
    async with trial.client() as http:
        for lines in readme_curls(readme, trial_keys):
            answered += await replay(lines, http, trial_keys, strip_key=True)
    assert answered
    assert {reply.status_code for _, reply in answered} == {401}
    assert all(
        set(reply.json()["error"]) >= {"message", "type", "param", "code"} for _, reply in answered
    )


# ------------------------------------------------- memory without a model (offline)

OFFLINE_MARK = "<!-- memory-without-a-model -->"
SHIPPED_CONFIG = README.parent / "config.yaml"
LISBON = "Lives in Lisbon since March"


@pytest.fixture
def offline_block(readme: str) -> list[str]:
    return block_after(readme, OFFLINE_MARK, "bash").replace("\\\n", " ").splitlines()


@pytest.fixture
async def open_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                       ) -> AsyncIterator[Gateway]:
    """The shipped config.yaml loaded from a fresh directory, no OPENAI_API_KEY, no keys:
    ``./scripts/serve`` on a fresh checkout. No model answers (the fake is never named)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    settings: Settings = load_settings(SHIPPED_CONFIG)
    assert not settings.auth.keys
    async with running_gateway(settings, FakeUpstream()) as gw:
        yield gw


async def run_offline(lines: list[str], http: httpx.AsyncClient,
                      variables: dict[str, str]) -> dict[str, httpx.Response]:
    """The block's commands, each answered 2xx; the replies by what they called."""
    answered = await replay(lines, http, variables)
    assert len(answered) == 4
    for curl, reply in answered:
        assert reply.status_code in {200, 201}, (curl, reply.status_code, reply.text[:300])
    adds, preview, search = answered[:2], answered[2], answered[3]
    assert preview[0].url.endswith("/v1/memories/preview")
    return {"lisbon": adds[0][1], "preview": preview[1], "search": search[1]}


def lisbon_first(replies: dict[str, httpx.Response]) -> None:
    """The preview would inject the Lisbon memory first; the search lists it first."""
    lisbon = replies["lisbon"].json()
    assert lisbon["content"] == LISBON
    preview = replies["preview"].json()
    assert (preview["object"], preview["status"]) == ("memory.preview", "injected")
    memories = [i for i in preview["items"] if i["kind"] == "memory"]
    assert memories[0]["memory_id"] == lisbon["id"]
    assert replies["search"].json()["data"][0]["id"] == lisbon["id"]


async def test_open_mode_adds_previews_and_searches_without_a_model(
    open_gateway: Gateway, offline_block: list[str]
) -> None:
    """Open mode: no key is sent (APP_KEY unset), every command is answered, the preview
    names the Lisbon memory first; the upstream was never called."""
    async with open_gateway.client() as http:
        replies = await run_offline(offline_block, http, {})
        me = await http.get("/v1/me", headers=bearer("any text"))
        console = await http.get("/console/")
    lisbon_first(replies)
    assert open_gateway.upstream.requests == []
    # the console's sign-in with any key is an app key: it asks which user to open
    assert (me.status_code, me.json()["role"], me.json()["user"]) == (200, "app", None)
    assert console.status_code == 200
    assert "text/html" in console.headers["content-type"]


async def test_trial_keys_send_the_app_key_and_alice_sees_her_memories(
    trial: Gateway, offline_block: list[str], trial_keys: dict[str, str]
) -> None:
    """With the trial keys exported the block sends ``$APP_KEY``; what it added is what
    alice's own key (the console's user view) lists. Without APP_KEY set it is refused."""
    async with trial.client() as http:
        keyless = await replay(offline_block, http, {})
        replies = await run_offline(offline_block, http, trial_keys)
        mine = await http.get("/v1/memories", headers=bearer(trial_keys["ALICE_KEY"]))
    assert {reply.status_code for _, reply in keyless} == {401}
    lisbon_first(replies)
    assert {m["content"] for m in mine.json()["data"]} == {LISBON, "Prefers short answers"}


def test_the_local_server_example_is_a_model_list_entry(readme: str, tmp_path: Path) -> None:
    """The section's YAML for a server elsewhere is a valid ``model_list`` entry named
    ``local`` whose model the relay sends to that server."""
    section = readme[readme.index(OFFLINE_MARK):]
    entry = yaml.safe_load(block_after(section, "A chat needs a model", "yaml"))
    settings = load_settings(use_file=False, model_list=entry,
                             storage={"path": str(tmp_path / "m.db")})
    [local] = settings.model_list
    assert local.model_name == "local"
    assert local.litellm_params.api_base == "http://127.0.0.1:11434/v1"
    assert local.litellm_params.model.startswith("openai/")
