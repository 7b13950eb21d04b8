"""``ip`` → ``[IP]``: globally routable IPv4 addresses and global unicast IPv6 addresses
(``2000::/3``), both checked with ``ipaddress`` (``is_global``);
private, loopback, documentation and reserved ranges are infrastructure, not personal data,
and a dotted quad right after "version"/"build"/"release"/"版本" is a version.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator

from proxy.learning.pii.findings import Span

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = re.compile(rf"(?<![0-9A-Za-z.]){_OCTET}(?:\.{_OCTET}){{3}}(?![0-9]|\.[0-9])")
# Global unicast IPv6 (2000::/3) is the only block handed to end users.
_IPV6 = re.compile(
    r"(?<![0-9A-Za-z:.])[23][0-9A-Fa-f]{0,3}(?::[0-9A-Fa-f]{0,4}){2,7}(?![0-9A-Za-z:])"
)
_VERSION_CONTEXT = re.compile(r"(?:(?<![A-Za-z])(?i:version|release|build|ver)\.?|版本)\s*$")


def find_ips(text: str, digits: int) -> Iterator[Span]:
    """Globally routable IPv4 and IPv6 addresses in ``text`` (not after a version word)."""
    if digits >= 4 and "." in text:
        for m in _IPV4.finditer(text):
            if _VERSION_CONTEXT.search(text, max(0, m.start() - 12), m.start()):
                continue
            if ipaddress.IPv4Address(m.group()).is_global:
                yield m.start(), m.end(), "ip"
    if text.count(":") >= 2:
        for m in _IPV6.finditer(text):
            try:
                address = ipaddress.IPv6Address(m.group())
            except ValueError:
                continue
            if address.is_global:
                yield m.start(), m.end(), "ip"
