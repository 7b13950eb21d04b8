"""Scrub personal data and secrets from chat text, replacing each finding with a placeholder.

Runs on every user/assistant message before learning and again on the facts the learning
model returns. Each kind is detected by a precise pattern plus a validity check,
so ordinary numbers (years, prices, quantities, dates, times, version strings, short ids)
stay untouched:

- ``phone`` → ``[PHONE]``: :mod:`~proxy.learning.pii.phones`;
- ``email`` → ``[EMAIL]``: :mod:`~proxy.learning.pii.emails`;
- ``cn_id`` → ``[ID_NUMBER]`` and ``bank_card`` → ``[BANK_CARD]``:
  :mod:`~proxy.learning.pii.ids`;
- ``secret`` → ``[SECRET]``: :mod:`~proxy.learning.pii.credentials`;
- ``ip`` → ``[IP]``: :mod:`~proxy.learning.pii.ips`;
- ``custom:<name>`` → ``[CUSTOM]``: tenant-supplied regexes.

Each detector module's docstring states exactly what it finds and what it leaves alone.
:mod:`~proxy.learning.pii.scrubber` runs them; :mod:`~proxy.learning.pii.findings` holds the
placeholders and the merge rule.

Overlapping findings of any kinds are merged into one placeholder over their union, so no
fragment of either survives and placeholders never nest. Text that already holds
placeholders is a fixed point: candidates overlapping a placeholder are discarded.

Speed, measured with ``timeit`` (best of 7 runs of 3000 calls, CPython 3.11, 2 shared vCPUs):
~14 µs for a 190-character English message and ~12 µs for a 150-character Chinese one without
personal data; ~67 µs for a 185-character message full of ordinary numbers (one phonenumbers
parse, of an 8-digit order number); ~130 µs for a 165-character message with a phone number,
an e-mail and an API key (including the rescan of the scrubbed text). Regexes are compiled at
import, detectors are gated by cheap checks (digit count, ``"@"``, keywords), and
phonenumbers (~20 µs a parse) dominates.
"""

from proxy.learning.pii.credentials import shannon_entropy
from proxy.learning.pii.findings import KINDS, PLACEHOLDERS, Finding, ScrubResult, placeholder_for
from proxy.learning.pii.ids import cn_id_valid, luhn_valid
from proxy.learning.pii.scrubber import Scrubber

__all__ = [
    "KINDS",
    "PLACEHOLDERS",
    "Finding",
    "ScrubResult",
    "Scrubber",
    "cn_id_valid",
    "luhn_valid",
    "placeholder_for",
    "shannon_entropy",
]
