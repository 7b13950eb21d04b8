"""README's "Keys for a local trial": the snippet, exactly as printed, starts a gateway on
which every README example reaches what it shows.

The YAML block and the ``export`` line are read from README.md by their markers, so an edit
of the README is what is tested. The gateway is the one the snippet configures (loaded by
``load_settings`` from the file, keys from the environment); only the ``local`` model's
``api_base`` is turned to the fake upstream. The README's curl commands (quick start, "Your
users' memory", the admin API) are replayed as curl would send them — method, headers, body
and its form content type, with the README's shell variables — and each must be answered,
not refused; the same command without its key is a 401.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

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
    return re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m.group(1), m.group(0)), line)


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
        if (scalar := re.match(r"^(\w+)=(\S.*)$", line)) is not None:
            variables[scalar.group(1)] = shlex.split(scalar.group(2))[0]
            continue
        words = shlex.split(line, comments=True)
        if words[:1] != ["curl"]:
            continue
        curl = _curl(words, files)
        if strip_key:
            curl.headers = [h for h in curl.headers if h[0].lower() != "authorization"]
        elif add_key is not None and not curl.has_key:
            curl.headers.append(("Authorization", f"Bearer {add_key}"))
        reply = await client.request(
            curl.method, README_ORIGIN.sub("", curl.url), headers=curl.headers, content=curl.body
        )
        if curl.save_to is not None:
            files[curl.save_to] = reply.content
        answered.append((curl, reply))
    return answered


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
    """Every README curl against the gateway, with the snippet's keys (the quick start's,
    which show open mode, with the app key as the README says): answered, never 401/403/5xx;
    only a placeholder id (``01JB…``) may be a 404. Writes land where the README says."""
    blocks = readme_curls(readme, trial_keys)
    assert len(blocks) >= 3
    answered = []
    async with trial.client() as http:
        for lines in blocks:
            answered += await replay(lines, http, trial_keys, add_key=trial_keys["APP_KEY"])
        shared = await http.get(
            "/v1/admin/memories?scope=shared", headers=bearer(trial_keys["ACME_ADMIN_KEY"])
        )
    assert len(answered) >= 20
    for curl, reply in answered:
        allowed = {200, 201, 202, 404} if PLACEHOLDER.search(curl.url) else {200, 201, 202}
        if "versions/2/restore" in curl.url:
            allowed = {200, 404}  # a prompt version the reader has not saved yet
        if PLACEHOLDER.search(curl.url) and "after=" in curl.url and reply.status_code == 400:
            # a placeholder is no memory id: the cursor's 400 names it
            assert reply.json()["error"]["param"] == "after", reply.text
            continue
        assert reply.status_code in allowed, (curl, reply.status_code, reply.text[:300])
    contents = [m["content"] for m in shared.json()["data"]]
    assert "Expense reports are due on Fridays" in contents


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
