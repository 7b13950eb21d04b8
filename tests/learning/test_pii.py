"""Tests for proxy.learning.pii: the PII and secret scrubber run before learning."""

# Chinese test text uses full-width punctuation and digits on purpose.

from __future__ import annotations

import datetime as dt
import re
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.learning.pii import (
    KINDS,
    PLACEHOLDERS,
    Finding,
    Scrubber,
    ScrubResult,
    cn_id_valid,
    luhn_valid,
    placeholder_for,
    shannon_entropy,
)

SCRUBBER = Scrubber()

# GB 11643-1999 check character: ISO 7064 MOD 11-2 with these weights.
_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_CHECK = "10X98765432"


def make_cn_id(first17: str) -> str:
    """Append the correct check character to 17 digits (independent of the module)."""
    return first17 + _CHECK[sum(int(d) * w for d, w in zip(first17, _WEIGHTS, strict=True)) % 11]


def make_luhn(prefix: str) -> str:
    """Append the Luhn check digit to ``prefix`` (independent of the module)."""
    total = 0
    for i, ch in enumerate(reversed(prefix)):
        d = int(ch)
        if i % 2 == 0:  # these positions are doubled once the check digit is appended
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return prefix + str((10 - total % 10) % 10)


def group4(number: str, separator: str) -> str:
    """Write a card number in groups of four separated by ``separator``."""
    return separator.join(number[i : i + 4] for i in range(0, len(number), 4))


def scrubbed(text: str, scrubber: Scrubber = SCRUBBER) -> str:
    return scrubber.scrub(text).text


# --- the known failure ------------------------------------------------------------------


def test_known_failure_openai_key_in_env_assignment() -> None:
    """The OPENAI_API_KEY=sk-test-... sentence keeps its words and loses the whole key."""
    text = (
        "Debug this: my config has OPENAI_API_KEY=sk-test-PLACEHOLDER0123456789abcdef "
        "and every call returns 401."
    )
    out = scrubbed(text)
    assert out == "Debug this: my config has OPENAI_API_KEY=[SECRET] and every call returns 401."
    assert "PLACEHOLDER" not in out
    assert "0123456789abcdef" not in out


# --- phone ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("call 13800138000 today", "call [PHONE] today"),
        ("call 138 0013 8000 today", "call [PHONE] today"),
        ("call 138-0013-8000 today", "call [PHONE] today"),
        ("call +86 138 0013 8000 today", "call [PHONE] today"),
        ("call +8613800138000 today", "call [PHONE] today"),
        ("我的手机号是13800138000，谢谢", "我的手机号是[PHONE]，谢谢"),
        ("电话：１３８００１３８０００", "电话：[PHONE]"),
        ("call +14155552671 now", "call [PHONE] now"),
        ("call +1 (415) 555-2671 now", "call [PHONE] now"),
        ("office +44 20 7946 0958 ok", "office [PHONE] ok"),
        ("Tokyo +81 3-1234-5678 ok", "Tokyo [PHONE] ok"),
        ("Berlin +49 30 123456 ok", "Berlin [PHONE] ok"),
        ("Hong Kong +852 2123 4567 ok", "Hong Kong [PHONE] ok"),
        ("座机 010-6552 9988 或 0755-8888 6666", "座机 [PHONE] 或 [PHONE]"),
        ("two: 13912345678, 15012345678.", "two: [PHONE], [PHONE]."),
    ],
)
def test_phone_numbers_are_scrubbed(text: str, expected: str) -> None:
    """Mainland mobiles in any grouping, landlines with area code and E.164 numbers go."""
    assert scrubbed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("+1 (415) 555-2671 13800138000", "[PHONE] [PHONE]"),
        ("+44 20 7946 0958  13800138000", "[PHONE]  [PHONE]"),
        ("+81 3-1234-5678 4111 1111 1111 1111", "[PHONE] [BANK_CARD]"),
        ("+1 (415) 555-2671 (  15541135207", "[PHONE] [PHONE]"),  # "(" is read as part of it
    ],
)
def test_numbers_glued_by_spaces_are_each_found(text: str, expected: str) -> None:
    """Numbers separated only by spaces, which phonenumbers reads as one, are each scrubbed."""
    assert scrubbed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "In 2023 we sold 1500 units at $3.14 each, 100 km away.",
        "Meeting on 2023-05-08 at 14:30, then 2024/01/15 09:00:00.",
        "Order #88886666 shipped; 12345678 items.",
        "订单号 202305081234 数量 12 件，总价 ¥12800.00",
        "Population 1,412,000,000 and GDP 17,963,000,000,000",
        "数字 13800 和 138001 及 1380013",
        "coordinates 39.9042, 116.4074",
        "Unix time 1715000000 and 1715000000123 ms",
        "ISBN 978-3-16-148410-0",
    ],
)
def test_ordinary_numbers_are_not_phones(text: str) -> None:
    """Years, prices, dates, quantities, order numbers and timestamps stay untouched."""
    assert scrubbed(text) == text


# --- email ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail zhang.san@example.com now", "mail [EMAIL] now"),
        ("mail john+newsletter@mail.example.co.uk.", "mail [EMAIL]."),
        ("邮箱是zhang_san-01@sub.example.cn，谢谢", "邮箱是[EMAIL]，谢谢"),
        ("<First.Last@Example.ORG>", "<[EMAIL]>"),
        ("mailto:ops@example.io", "mailto:[EMAIL]"),
        ("email:a@b.co", "email:[EMAIL]"),
        ("see https://foo.com/?email=bob@example.com", "see https://foo.com/?email=[EMAIL]"),
    ],
)
def test_email_addresses_are_scrubbed(text: str, expected: str) -> None:
    """Addresses with dots, plus-tags, subdomains and any neighbouring script go."""
    assert scrubbed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "ping @username on the thread",
        "use the @property decorator and @types/node",
        "assets icon@2x.png and logo@3x.webp",
        "remote git@github.com:org/repo.git",
        "install pkg@1.2.3 with npm",
        "user@localhost has no domain",
        "https://example.com/path/to/thing?x=1",
    ],
)
def test_email_lookalikes_are_kept(text: str) -> None:
    """Mentions, decorators, asset names, SSH remotes and versions are not addresses."""
    assert scrubbed(text) == text


# --- cn_id ------------------------------------------------------------------------------

VALID_IDS = [
    make_cn_id("11010519491231002"),  # ends in X
    make_cn_id("44030419851231001"),
    make_cn_id("51010820001129123"),
    make_cn_id("32010619780101234"),
]


def test_valid_id_fixtures_are_valid() -> None:
    """The fixture ID numbers satisfy the module's own checksum and date rules."""
    assert VALID_IDS[0].endswith("X")
    assert all(cn_id_valid(n) for n in VALID_IDS)


@pytest.mark.parametrize("number", VALID_IDS)
@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("身份证号{}，请保密", "身份证号[ID_NUMBER]，请保密"),
        ("ID: {}.", "ID: [ID_NUMBER]."),
    ],
)
def test_cn_id_numbers_are_scrubbed(number: str, template: str, expected: str) -> None:
    """18-character resident ID numbers with a correct check character go."""
    assert scrubbed(template.format(number)) == expected


def test_cn_id_lowercase_x_and_spaced_form_are_scrubbed() -> None:
    """A lower-case check X and the 6-8-4 spaced layout are recognised too."""
    number = VALID_IDS[0]
    assert scrubbed(f"id {number[:-1]}x ok") == "id [ID_NUMBER] ok"
    spaced = f"{number[:6]} {number[6:14]} {number[14:]}"
    assert scrubbed(f"id {spaced} ok") == "id [ID_NUMBER] ok"


def _wrong_check(number: str) -> str:
    return number[:-1] + ("1" if number[-1] != "1" else "2")


@pytest.mark.parametrize(
    "number",
    [
        _wrong_check(VALID_IDS[1]),  # bad checksum
        _wrong_check(VALID_IDS[2]),
        make_cn_id("44030418991231001"),  # born 1899
        make_cn_id(f"440304{dt.date.today().year + 1}0101001"),  # born next year
        make_cn_id("44030419850230001"),  # 30 February
        make_cn_id("44030419851301001"),  # month 13
        "4403041985123100111",  # 19 digits
    ],
)
def test_invalid_id_numbers_are_kept(number: str) -> None:
    """Wrong checksum, impossible birth dates or the wrong length are not ID numbers."""
    text = f"编号 {number} 结束"
    result = SCRUBBER.scrub(text)
    assert "cn_id" not in result.counts


def test_id_number_that_also_passes_luhn_is_an_id() -> None:
    """An ID number that happens to pass Luhn is reported once, as an ID number."""
    number = next(
        n
        for n in (make_cn_id(f"31011519881203{seq:03d}") for seq in range(1000))
        if luhn_valid(n)
    )
    result = SCRUBBER.scrub(f"号码 {number} 好")
    assert result.text == "号码 [ID_NUMBER] 好"
    assert result.counts == {"cn_id": 1}


# --- bank_card --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "number",
    [
        "4111111111111111",
        "4111 1111 1111 1111",
        "4111-1111-1111-1111",
        "5500 0000 0000 0004",
        "378282246310005",
        "3782 822463 10005",
        "6011111111111117",
        "3530111333300000",
        "4222222222222",
        make_luhn("622202123456789"),
        make_luhn("621226120200123456"),
        group4(make_luhn("621226120200123456"), " "),
        group4(make_luhn("62220212345678"), "-"),
    ],
)
def test_bank_cards_are_scrubbed(number: str) -> None:
    """13-19 digit Luhn-valid card numbers, contiguous or grouped, go."""
    assert scrubbed(f"卡号 {number} 谢谢") == "卡号 [BANK_CARD] 谢谢"


@pytest.mark.parametrize(
    "text",
    [
        "Random 16 digits 1234567812345678 fail Luhn",
        "grouped 4111 1111 1111 1112 fails Luhn",
        "12 digits 411111111111 too short",
        "20 digits 41111111111111111111 too long",
        "dates 2023-05-08 and 2024-06-09",
    ],
)
def test_card_lookalikes_are_kept(text: str) -> None:
    """Luhn failures and wrong lengths are not bank cards."""
    assert "bank_card" not in SCRUBBER.scrub(text).counts


def test_luhn_valid_number_without_card_prefix_is_kept() -> None:
    """A Luhn-valid 13-digit millisecond timestamp (prefix 1) is not a bank card."""
    stamp = make_luhn("171500000012")
    assert luhn_valid(stamp)
    assert scrubbed(f"timestamp {stamp} ms") == f"timestamp {stamp} ms"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("item 12 4111 1111 1111 1111 paid", "item 12 [BANK_CARD] paid"),
        ("card 4111 1111 1111 1111 1 of 2", "card [BANK_CARD] 1 of 2"),
        ("card 4111 1111 1111 1111 2023", "card [BANK_CARD] 2023"),
    ],
)
def test_card_next_to_stray_numbers_is_still_found(text: str, expected: str) -> None:
    """A grouped card with an unrelated small number before or after it is still found."""
    assert scrubbed(text) == expected


# --- secret -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key sk-proj-AbCdEf0123456789GhIjKl here", "key [SECRET] here"),
        ("key sk-ant-api03-AbCdEf0123456789GhIjKlMn_op here", "key [SECRET] here"),
        ("key sk-1234567890abcdefABCDEF here", "key [SECRET] here"),
        ("gh ghp_1234567890abcdefghijklmnopqrstuvwxyz here", "gh [SECRET] here"),
        ("gh github_pat_11ABCDEFG0123456789_abcdefghijkl here", "gh [SECRET] here"),
        ("slack xoxb-1234567890-abcdefghij here", "slack [SECRET] here"),
        ("aws AKIAIOSFODNN7EXAMPLE here", "aws [SECRET] here"),
        ("g AIzaSyA1234567890abcdefghijklmnopqrstuv here", "g [SECRET] here"),
        ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc here", "stripe [SECRET] here"),
        ("stripe pk_live_51H8abcdefGHIJKL0123 here", "stripe [SECRET] here"),
        (
            "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N here",
            "jwt [SECRET] here",
        ),
        ("Authorization: Bearer abc123.def456-ghi", "Authorization: Bearer [SECRET]"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic [SECRET]"),
        (
            "db postgres://admin:hunter2@db.example.com:5432/app ok",
            "db postgres://admin:[SECRET]@db.example.com:5432/app ok",
        ),
        ("redis://:s3cr3tpw@cache:6379/0", "redis://:[SECRET]@cache:6379/0"),
        ("API_KEY=abc123", "API_KEY=[SECRET]"),
        ("password: hunter2, user: bob", "password: [SECRET], user: bob"),
        ("secret=topsecret", "secret=[SECRET]"),
        ("token=abcd1234", "token=[SECRET]"),
        ('{"password": "correct horse battery"}', '{"password": "[SECRET]"}'),
        ("client_secret = 'xyz987'", "client_secret = '[SECRET]'"),
        (
            "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "aws_secret_access_key = [SECRET]",
        ),
        ("X-Api-Key: 9f8e7d6c5b4a", "X-Api-Key: [SECRET]"),
        ("run tool --api-key abc123def --verbose", "run tool --api-key [SECRET] --verbose"),
        ("my password is hunter2!", "my password is [SECRET]!"),
        ("我的密码是abc123。", "我的密码是[SECRET]。"),
        ("密码：Passw0rd!，别告诉别人", "密码：[SECRET]，别告诉别人"),
        (
            "blob ZGVhZGJlZWYxMjM0NTY3ODkwYWJjZGVmZ2hpamtsbW5vcA== end",
            "blob [SECRET] end",
        ),
        ("opaque 8Kx2mQ9vR4tLp7Wz3Nc6Yb1Hd5Fg0Js2 end", "opaque [SECRET] end"),
    ],
)
def test_secrets_are_scrubbed(text: str, expected: str) -> None:
    """Vendor keys, JWTs, auth headers, URL passwords, assignments and random tokens go."""
    assert scrubbed(text) == expected


def test_pem_private_key_block_is_replaced_whole() -> None:
    """A PEM private key block becomes one placeholder, text around it stays."""
    text = (
        "here:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAwQ2r7g8kYp9Xv3mN0aBc\n"
        "DeFgHiJkLmNoPqRsTuVw==\n-----END RSA PRIVATE KEY-----\nthanks"
    )
    assert scrubbed(text) == "here:\n[SECRET]\nthanks"


def test_truncated_pem_block_loses_its_body() -> None:
    """A pasted key without its END line loses the base64 body but not later prose."""
    text = (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
        "AAAAAAAAAAEAAAAzAAAAC3NzaC1lZDI1NTE5AAAAI\n\nand then ssh failed"
    )
    out = scrubbed(text)
    assert out == "[SECRET]\n\nand then ssh failed"


@pytest.mark.parametrize(
    "text",
    [
        "git sha 3f786850e387550fdab836ed7e6dc881de23001b is the fix",
        "uuid 123e4567-e89b-12d3-a456-426614174000 row",
        "md5 d41d8cd98f00b204e9800998ecf8427e",
        "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "https://github.com/BerriAI/litellm/blob/main/litellm/proxy/proxy_server.py#L1234",
        "https://docs.python.org/3/library/re.html?highlight=lookbehind#regular-expression",
        "path /home/user/projects/my_project_2023/src/components/Button2.tsx",
        "getUserAccountSettingsForTenantId2 and this-is-a-very-long-kebab-case-slug-2023",
        "max_tokens=512, token_type: bearer, tokenizer=cl100k",
        "Bearer authentication is described in RFC 6750",
        "sk-learn-compatible-estimators are nice",
        "api_key=${OPENAI_API_KEY} and api_key=os.environ[ and password=None",
        "Upgrade litellm from 1.82.6 to 1.82.9 (1.82.7 was compromised)",
        "the password is incorrect",
        "密码是什么？",
        "base64 of hello is aGVsbG8=",
        "an ordinary sentence with words like authentication and credentials",
    ],
)
def test_secret_lookalikes_are_kept(text: str) -> None:
    """Git shas, digests, UUIDs, URLs, paths, identifiers and references are not secrets."""
    assert scrubbed(text) == text


def test_shannon_entropy_values() -> None:
    """Entropy is 0 for one repeated symbol and log2(n) for n equally frequent symbols."""
    assert shannon_entropy("") == 0.0
    assert shannon_entropy("aaaa") == 0.0
    assert shannon_entropy("abcd") == pytest.approx(2.0)
    assert shannon_entropy("0123456789abcdef" * 2) == pytest.approx(4.0)


# --- ip ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("my ip is 8.8.8.8.", "my ip is [IP]."),
        ("server 114.114.114.114:53", "server [IP]:53"),
        ("v6 2606:4700:4700::1111 ok", "v6 [IP] ok"),
    ],
)
def test_public_ip_addresses_are_scrubbed(text: str, expected: str) -> None:
    """Globally routable IPv4 and IPv6 addresses go."""
    assert scrubbed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "router 192.168.1.1, host 10.0.0.1, loopback 127.0.0.1, ::1",
        "docs range 203.0.113.5 and 2001:db8::1",
        "version 1.2.3.4 and build 10.0.19045.3693, 版本 1.2.3.4",
        "at 12:30:45 and 23:59:59",
        "mac 00:1A:2B:3C:4D:5E",
    ],
)
def test_private_ips_versions_and_times_are_kept(text: str) -> None:
    """Private, documentation and loopback ranges, versions, times and MACs stay."""
    assert scrubbed(text) == text


# --- whole texts, offsets, counts ---------------------------------------------------------


def test_chinese_text_with_phone_and_email() -> None:
    """Chinese text around findings stays intact and offsets point into the original."""
    text = "我的手机号是13800138000，邮箱是zhang.san@example.com"
    result = SCRUBBER.scrub(text)
    assert result.text == "我的手机号是[PHONE]，邮箱是[EMAIL]"
    assert [f.kind for f in result.findings] == ["phone", "email"]
    assert [text[f.start : f.end] for f in result.findings] == [
        "13800138000",
        "zhang.san@example.com",
    ]
    assert result.counts == {"phone": 1, "email": 1}


def test_findings_are_sorted_disjoint_and_counted() -> None:
    """Findings come in text order, never overlap, and counts add them up per kind."""
    text = (
        "call 13800138000 or 13900139000, mail a@example.com, "
        "card 4111111111111111, key sk-proj-AbCdEf0123456789GhIjKl"
    )
    result = SCRUBBER.scrub(text)
    starts = [f.start for f in result.findings]
    assert starts == sorted(starts)
    assert all(a.end <= b.start for a, b in pairwise(result.findings))
    assert result.counts == {"phone": 2, "email": 1, "bank_card": 1, "secret": 1}
    assert isinstance(result.findings[0], Finding)


def test_text_without_findings_is_returned_unchanged() -> None:
    """A clean text comes back as the same object with no findings."""
    text = "Plain words, 2023, 3.14 and 100 km."
    result = SCRUBBER.scrub(text)
    assert result == ScrubResult(text, ())
    assert result.text is text
    assert result.counts == {}
    assert not SCRUBBER.contains_pii(text)


def test_contains_pii_matches_scrub() -> None:
    """contains_pii is True exactly when scrub changes the text."""
    for text in ("call 13800138000", "nothing here", "[PHONE] already", "password: hunter2"):
        assert SCRUBBER.contains_pii(text) == (scrubbed(text) != text)


def test_overlapping_findings_merge_into_one_placeholder() -> None:
    """A secret assignment whose value is also a vendor key yields one placeholder."""
    result = SCRUBBER.scrub("token=ghp_1234567890abcdefghijklmnopqrstuvwxyz")
    assert result.text == "token=[SECRET]"
    assert len(result.findings) == 1


# --- idempotence and placeholders ---------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "我的手机号是13800138000，邮箱是zhang.san@example.com",
        "OPENAI_API_KEY=sk-test-PLACEHOLDER0123456789abcdef",
        "postgres://admin:hunter2@db.example.com/app",
        "password: hunter2 and 4111 1111 1111 1111 and 8.8.8.8",
        '{"api_key": "abc123", "token": "zzz999"}',
    ],
)
def test_scrub_is_idempotent(text: str) -> None:
    """Scrubbing already-scrubbed text changes nothing and finds nothing."""
    once = scrubbed(text)
    assert once != text
    again = SCRUBBER.scrub(once)
    assert again.text == once
    assert again.findings == ()


def test_rescan_catches_what_a_neighbouring_finding_hid() -> None:
    """An IP hidden by a phone glued to it is found on the rescan, at original offsets."""
    text = "see 8.8.8.8.13800138000 now"
    result = SCRUBBER.scrub(text)
    assert result.text == "see [IP].[PHONE] now"
    assert [(f.kind, text[f.start : f.end]) for f in result.findings] == [
        ("ip", "8.8.8.8"),
        ("phone", "13800138000"),
    ]
    assert SCRUBBER.scrub(result.text).findings == ()


_PRONE = st.sampled_from(
    ["1", "3", "8", "0", "13800138000", "4111 1111 1111 1111", "a", "Z", "@", ".", "-", " ",
     "+", ":", "=", "/", "[", "]", "password", "token", "api_key", "sk-", "http://",
     "example.com", "密码", "：", "[PHONE]", "[SECRET]", "eyJ", "Bearer ", "\n", "(", ")",
     "8.8.8.8", "::", "2001", "abcd"]
)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(_PRONE, max_size=30).map("".join))
def test_scrub_is_a_fixed_point_on_pii_prone_text(text: str) -> None:
    """For text built from PII fragments, a second scrub finds nothing and changes nothing."""
    once = SCRUBBER.scrub(text)
    findings = once.findings
    assert all(a.end <= b.start for a, b in pairwise(findings))
    again = SCRUBBER.scrub(once.text)
    assert again.text == once.text
    assert again.findings == ()


def test_placeholders_never_match() -> None:
    """Placeholders, alone or where a value would be, are not findings themselves."""
    text = " ".join(PLACEHOLDERS.values()) + (
        " password: [SECRET] api_key=[SECRET] postgres://u:[SECRET]@h 密码：[SECRET] "
        "Bearer [SECRET]"
    )
    assert SCRUBBER.scrub(text).findings == ()


def test_placeholder_texts() -> None:
    """Each kind maps to its documented placeholder, custom kinds to [CUSTOM]."""
    assert PLACEHOLDERS["phone"] == "[PHONE]"
    assert PLACEHOLDERS["email"] == "[EMAIL]"
    assert PLACEHOLDERS["cn_id"] == "[ID_NUMBER]"
    assert PLACEHOLDERS["bank_card"] == "[BANK_CARD]"
    assert PLACEHOLDERS["secret"] == "[SECRET]"
    assert placeholder_for("custom:anything") == "[CUSTOM]"
    assert frozenset({"phone", "email", "cn_id", "bank_card", "secret", "ip"}) == KINDS


# --- configuration ----------------------------------------------------------------------

MIXED = "call 13800138000, mail a@example.com, API_KEY=abc123, card 4111111111111111"


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (
            frozenset({"phone"}),
            "call [PHONE], mail a@example.com, API_KEY=abc123, card 4111111111111111",
        ),
        (
            frozenset({"email", "secret"}),
            "call 13800138000, mail [EMAIL], API_KEY=[SECRET], card 4111111111111111",
        ),
        (
            frozenset({"bank_card"}),
            "call 13800138000, mail a@example.com, API_KEY=abc123, card [BANK_CARD]",
        ),
        (frozenset(), MIXED),
    ],
)
def test_kinds_restricts_detection(kinds: frozenset[str], expected: str) -> None:
    """Only the selected kinds are scrubbed."""
    assert scrubbed(MIXED, Scrubber(kinds=kinds)) == expected


def test_unknown_kind_and_region_are_rejected() -> None:
    """Typos in kinds or the phone region fail loudly at construction."""
    with pytest.raises(ValueError, match="unknown PII kinds"):
        Scrubber(kinds=frozenset({"phones"}))
    with pytest.raises(ValueError, match="region"):
        Scrubber(default_region="XX")


def test_default_region_reads_national_numbers() -> None:
    """With region US a national US number is a phone; E.164 works in any region."""
    us = Scrubber(default_region="US")
    assert scrubbed("call (650) 253-0000 now", us) == "call [PHONE] now"
    assert scrubbed("call +44 20 7946 0958 now", us) == "call [PHONE] now"


def test_extra_patterns_are_scrubbed_as_custom() -> None:
    """Tenant patterns become kind custom:<name> with the [CUSTOM] placeholder."""
    scrubber = Scrubber(extra_patterns={"employee": r"EMP-\d{6}", "project": r"Project\s+Falcon"})
    result = scrubber.scrub("EMP-123456 works on Project Falcon, call 13800138000")
    assert result.text == "[CUSTOM] works on [CUSTOM], call [PHONE]"
    assert result.counts == {"custom:employee": 1, "custom:project": 1, "phone": 1}


def test_extra_patterns_apply_whatever_kinds_says() -> None:
    """Extra patterns run even when kinds selects no built-in kind."""
    scrubber = Scrubber(kinds=frozenset(), extra_patterns={"emp": r"EMP-\d{6}"})
    assert scrubbed("EMP-123456 at 13800138000", scrubber) == "[CUSTOM] at 13800138000"


def test_extra_patterns_keep_placeholders_a_fixed_point() -> None:
    """A broad tenant pattern never rewrites placeholders, and empty matches are ignored."""
    scrubber = Scrubber(extra_patterns={"caps": r"[A-Z]{5,}", "empty": r"x*"})
    once = scrubber.scrub("HELLO 13800138000")
    assert once.text == "[CUSTOM] [PHONE]"
    assert scrubber.scrub(once.text).findings == ()


def test_invalid_extra_pattern_is_rejected() -> None:
    """A regex that does not compile fails at construction with its name."""
    with pytest.raises(ValueError, match="'broken'"):
        Scrubber(extra_patterns={"broken": "("})


# --- property test ------------------------------------------------------------------------

# Filler cannot form PII: CJK characters, a few vowels, spaces and CJK punctuation (no
# digits, no '@', no letters that spell a key word, no runs of token characters with digits).
_FILLER = st.text(alphabet="的一是在不了有和人这中大为上个我以要他aeiou ，。！？\n", max_size=40)
_SEPARATOR = st.sampled_from([" ", "，", "。", "：", "\n", " ( ", "、"])

_E164 = [
    "+14155552671",
    "+1 (415) 555-2671",
    "+44 20 7946 0958",
    "+81 3-1234-5678",
    "+49 30 123456",
    "+852 2123 4567",
    "+65 6123 4567",
]


@st.composite
def _cn_mobile(draw: st.DrawFn) -> str:
    number = draw(st.from_regex(r"1[3-9][0-9]{9}", fullmatch=True))
    layout = draw(st.sampled_from(["plain", "space", "dash", "+86", "+86 space"]))
    grouped_space = f"{number[:3]} {number[3:7]} {number[7:]}"
    return {
        "plain": number,
        "space": grouped_space,
        "dash": f"{number[:3]}-{number[3:7]}-{number[7:]}",
        "+86": f"+86{number}",
        "+86 space": f"+86 {grouped_space}",
    }[layout]


@st.composite
def _email(draw: st.DrawFn) -> str:
    atom = st.from_regex(r"[a-z][a-z_+-]{0,8}", fullmatch=True)
    local = ".".join(draw(st.lists(atom, min_size=1, max_size=3)))
    labels = draw(st.lists(st.from_regex(r"[a-z]{1,10}", fullmatch=True), min_size=1, max_size=3))
    tld = draw(st.sampled_from(["com", "cn", "org", "io", "co.uk"]))
    return f"{local}@{'.'.join(labels)}.{tld}"


@st.composite
def _cn_id(draw: st.DrawFn) -> str:
    area = draw(st.from_regex(r"[1-9][0-9]{5}", fullmatch=True))
    born = draw(st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date.today()))
    seq = draw(st.from_regex(r"[0-9]{3}", fullmatch=True))
    number = make_cn_id(f"{area}{born:%Y%m%d}{seq}")
    if draw(st.booleans()):
        return number
    return f"{number[:6]} {number[6:14]} {number[14:]}"


@st.composite
def _card(draw: st.DrawFn) -> str:
    length = draw(st.integers(min_value=13, max_value=19))
    first = draw(st.sampled_from("234569"))
    rest = draw(st.from_regex(rf"[0-9]{{{length - 2}}}", fullmatch=True))
    number = make_luhn(first + rest)
    return group4(number, draw(st.sampled_from(["", " ", "-"])))


@st.composite
def _sk_key(draw: st.DrawFn) -> str:
    prefix = draw(st.sampled_from(["sk-", "sk-proj-", "sk-test-", "sk-ant-api03-"]))
    body = draw(st.from_regex(r"[A-Za-z0-9_-]{16,40}", fullmatch=True))
    digit = draw(st.sampled_from("0123456789"))
    return f"{prefix}{body}{digit}"


_SEED = st.one_of(
    _cn_mobile(), st.sampled_from(_E164), _email(), _cn_id(), _card(), _sk_key()
)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.tuples(_FILLER, _SEPARATOR, _SEED, _SEPARATOR), min_size=1, max_size=5), _FILLER)
def test_seeded_pii_never_survives(parts: list[tuple[str, str, str, str]], tail: str) -> None:
    """No seeded phone, e-mail, ID, card or key (nor any digit of one) survives a scrub."""
    text = "".join(f"{filler}{sep1}{seed}{sep2}" for filler, sep1, seed, sep2 in parts) + tail
    result = SCRUBBER.scrub(text)
    for _, _, seed, _ in parts:
        assert seed not in result.text
    # Filler has no digits, so any digit left over is a fragment of a seed.
    assert not re.search(r"[0-9]", result.text), result.text
    assert SCRUBBER.scrub(result.text).text == result.text


# --- beyond the obvious layouts: fictional ranges, separators, spelled-out forms ------

@pytest.mark.parametrize(("text", "expected"), [
    ("call me on +44 7700 900123", "call me on [PHONE]"),  # Ofcom drama range: "invalid"
    ("call me on +44 7700 900 456.", "call me on [PHONE]."),
    ("+1 555 010 0199 is my cell", "[PHONE] is my cell"),  # NANP fictional 555-01xx
    ("+61 491 570 006", "[PHONE]"),  # ACMA fictional mobile
    ("+999 1234 5678", "[PHONE]"),  # unassigned country code
    ("＋44 7700 900123", "[PHONE]"),
    ("(555) 010-0147 after six", "[PHONE] after six"),
    ("office (0755) 8888-6666", "office [PHONE]"),
    ("dial 555-010-0147 now", "dial [PHONE] now"),
])
def test_phone_numbers_whatever_their_metadata_says(text: str, expected: str) -> None:
    """A ``+`` number of 8-15 digits is a phone number even when phonenumbers calls it
    invalid (fictional or unassigned ranges); bracketed and dashed national forms too."""
    assert scrubbed(text) == expected


@pytest.mark.parametrize("separator", ["-", ".", " "])
def test_id_and_card_numbers_with_separators(separator: str) -> None:
    """PRC ID numbers (6-8-4 or groups of four) and card numbers written with dashes, dots
    or spaces are found like the contiguous ones."""
    number = VALID_IDS[1]
    six_eight_four = separator.join((number[:6], number[6:14], number[14:]))
    fours = separator.join(number[i:i + 4] for i in range(0, 18, 4))
    card = group4(make_luhn("622202123456789"), separator)
    assert scrubbed(f"ID {six_eight_four} ok") == "ID [ID_NUMBER] ok"
    assert scrubbed(f"ID {fours} ok") == "ID [ID_NUMBER] ok"
    assert scrubbed(f"card {card} ok") == "card [BANK_CARD] ok"


@pytest.mark.parametrize(("text", "expected"), [
    ("mail alice＠example.com", "mail [EMAIL]"),
    ("mail alice＠example．com", "mail [EMAIL]"),
    ("write to alice at example dot com please", "write to [EMAIL] please"),
    ("alice [at] example [dot] co [dot] uk", "[EMAIL]"),
    ("alice(at)example(dot)org", "[EMAIL]"),
    ("bob AT mail DOT cn", "[EMAIL]"),
    ("alice dot smith at example dot com", "[EMAIL]"),
    ("mail alice dot smith at example dot com please", "mail [EMAIL] please"),
    ("alice underscore lee at mail dot cn", "[EMAIL]"),
    ("alice dash lee [at] my dash site [dot] co [dot] uk", "[EMAIL]"),
    ("alice plus news at example dot org", "[EMAIL]"),
    ("alice dot smith at example.com", "[EMAIL]"),
    ("alice [at] example.com", "[EMAIL]"),
    ("a.smith AT example DOT com ok", "[EMAIL] ok"),
    ("alice at example dot com and bob dot lee at mail dot org", "[EMAIL] and [EMAIL]"),
])
def test_spelled_and_full_width_email_addresses(text: str, expected: str) -> None:
    """E-mail addresses with a full-width ``＠`` or spelled out go — every separator of
    the local part and the domain as a word ("alice dot smith at example dot com")."""
    assert scrubbed(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("key sk- abcd 1234 efgh 5678 ijkl 9012 mnop", "key [SECRET]"),
    ("key sk-abcd-1234-efgh-5678-ijkl-9012 ok", "key [SECRET] ok"),
    ("aws AKIA-IOSF-ODNN-7EXA-MPLE", "aws [SECRET]"),
    ("aws AKIA IOSF ODNN 7EXA MPLE.", "aws [SECRET]."),
    ("token ghp_ABCD.1234.EFGH.5678.IJKL", "token [SECRET]"),
])
def test_keys_with_separators(text: str, expected: str) -> None:
    """Vendor keys pasted in groups separated by spaces, dashes or dots go."""
    assert scrubbed(text) == expected


@pytest.mark.parametrize("text", [
    "look at this dot product", "we meet at home dot then go", "Score +12 to 345",
    "Revenue grew +3.5% in 2024-01-15.", "ISBN 978-3-16-148410-0", "1234-5678",
    "sk- learn is great for data science work", "AKIA is an acronym here",
    "Meeting 2024-05-06 10-12-14", "between 2019-2023 and 2024-2026", "temperature +20.5 C",
])
def test_new_layouts_leave_ordinary_text_alone(text: str) -> None:
    """The looser layouts do not take prose, dates, ranges, ISBNs or short numbers."""
    assert scrubbed(text) == text


KEY = "sk-proj-AbCdEf0123456789GhIjKl"


@pytest.mark.parametrize(("text", "expected"), [
    (f"key {' '.join(KEY)} here", "key [SECRET] here"),
    (f"key {'  '.join(KEY)}", "key [SECRET]"),
    (f"密钥是 {' '.join(KEY)}", "密钥是 [SECRET]"),
    (f"aws {'.'.join('AKIAIOSFODNN7EXAMPLE')} ok", "aws [SECRET] ok"),
    (f"token {', '.join('ghp_AbCd1234EfGh5678IjKl9012')}", "token [SECRET]"),
    (f"tok {' '.join('Xk9Qz2Lm7Rt4Wv8Bn3Yc6Hd1Jf5Gs0Pa')} ok", "tok [SECRET] ok"),
])
def test_keys_pasted_one_character_at_a_time(text: str, expected: str) -> None:
    """A vendor key or a random token spaced out letter by letter goes whole."""
    assert scrubbed(text) == expected


@pytest.mark.parametrize("text", [
    "looked at the dot com bubble", "works at example.com", "I was at school dot com era",
    "Meet me at noon dot", "Joe plus one at the party dot com",
    "A B C D E F G H I J K L M N O P Q R", "H E L L O W O R L D I S H E R E",
    "1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7", "s k - l e a r n - c o m p a t i b l e",
    "The letters a b c d e f g h i j k l m n o p are the start",
    "J. R. R. Tolkien and U.S.A. and A.B.C.D.E.F.G.H.I.J.K.L.M.N.O.P",
])
def test_spelled_forms_leave_prose_and_spaced_letters_alone(text: str) -> None:
    """Sentences with "at" and "dot", and spaced letters that join to no key, stay."""
    assert scrubbed(text) == text
