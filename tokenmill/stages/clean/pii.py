"""Rule 5b of cleaning, PII masking: e-mail addresses, IPv4/IPv6 addresses (and, when asked, phone numbers) replaced
by placeholders before anything of the text is written (records, rejected samples, examples, later stages).

What is masked, and the near misses a rule can tell apart (tests/stages/clean/test_pii.py has a case for each):

- e-mail: `local@domain.tld`, the TLD 2-24 letters. Not masked: `user@localhost` (no dot), `@decorators` and
  `@mentions` (no local part), `lodash@4.17.21` (numeric TLD), `a@b.T` (one-letter TLD), `icon@2x.png` (a one-label
  domain ending in a file extension: retina images, `name@file.py`). An attribute in code such as `x@self.weight`
  is masked: it cannot be told from an address.
- IPv4: four decimal parts 0-255, each zero-padded to at most 3 digits (`192.168.001.010` is 192.168.1.10), not
  inside a longer dotted number (`1.2.3.4.5`, `v1.2.3.4`). Not masked: a version or section number by context. Before
  it: a version word (`version`/`ver`/`v`/`release(d)`/`build`/`rev`/`firmware`/`update(d)`/`upgrade(d)`/`bump`/
  `patch`/`kernel`/`section`/`chapter`, then optionally `is`/`was`/`to`/`as`: `We released 2.10.14.3`, `upgraded to
  4.12.0.1`), `§`, a `lib...` name and a space (`libfoo 12.4.0.1`), a name joined by `/` or `-` (`Chrome/120.0.0.0`,
  `foo-3.14.15.92`), a pin (`numpy==1.26.4.2`, `>=`, `~=`, `!=`), a changelog heading (`## [2.10.14.3]`). After it:
  a pre-release or build part (`4.12.0.1-rc2`, `1.2.3.40+build.7`, `.RELEASE`), `release`/`version`/`build`, a
  changelog date (`12.4.0.1 (2023-12-01)`). `@` is no version join (`root@93.184.216.34` is an ssh login), nor is
  a single `=` (`host=93.184.216.34`). A quad whose values are all below 10 (`1.2.3.4`, `3.1.4.1`, `01.02.03.04`:
  section and version numbers) is masked only where it is plainly an address: a URL's host (`http://1.2.3.4/x`), a
  login (`root@1.2.3.4`), `IP`/`address`/`host`/`server`/`ping`/`nameserver`/`DNS`/`gateway`/`inet`/`proxy` (or a key
  ending so: `client_ip`) before it (`IP 8.8.8.8`, `IP is 8.8.8.8`), or a port after it (`1.2.3.4:8080`, `port 22`).
  A product name and a space (`Chrome 120.0.0.0`) cannot be told from `host 93.184.216.34`: it is masked. With
  `pii_ip_scope: public` (the default) every address that is not globally routable stays: private, loopback,
  link-local, documentation, multicast, reserved ranges.
- IPv6: what `ipaddress` parses (`::` compression, an embedded IPv4 tail), with at least one digit; MAC addresses
  (6 groups) and times (`12:30:45`) do not parse. The same scope rule.
- phone (off by default, `pii_phone`): `+<country> ...` with 8-15 digits, and North American `(555) 123-4567`,
  `555-123-4567`, `555.123.4567`. Not masked: dates (`2023-01-02`), number ranges, ISBNs.

Masked: the text (before metadata extraction, so a header line moves into meta masked) and the string fields of
chat records (messages, prompt, chosen, ...); rejected samples and before/after examples are masked again where they
show input text. Not masked: the other meta values (url, provenance) the reader put there, kept as they came.

Masking is cheap on text that cannot hold any of these: each kind runs only after a C-speed precheck (`'@' in`,
`'.' in` then a digit-dot search, `':' in` then a hex-colon search), so the chinese-poetry corpus (no '@', '.' or
':') costs three substring tests per record. Placeholders are validated (settings) never to match a rule, so
masking is idempotent: a masked text masks to itself (the samples and examples re-mask what they show).
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

KINDS = ("email", "ip_address", "phone")  # the counters: pii_<kind> in _stats.json and the funnel

EMAIL_RE = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9](?:[A-Za-z0-9._%+-]{0,62}[A-Za-z0-9_%+-])?"  # local part, not ending with a dot
    r"@((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+)([A-Za-z]{2,24})(?![\w-]|\.[A-Za-z0-9]|@)"
)
# a one-label domain ending in one of these is a file name (icon@2x.png, name@file.py), not an address
FILE_EXTENSIONS = frozenset(
    "png jpg jpeg gif svg webp bmp ico tif tiff avif heic pdf js mjs ts tsx jsx css scss html htm php py rb go rs "
    "java kt swift json xml yml yaml toml md rst txt csv log zip gz tgz tar bz2 xz 7z rar mp3 mp4 mov avi mkv wav "
    "ogg flac exe dll so dylib bin dat woff woff2 ttf otf eot".split()
)

_OCTET = r"(?:25[0-5]|2[0-4]\d|[01]\d\d|\d\d?)"  # 0-255, zero-padded to at most 3 digits
IPV4_RE = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\w|\.\d)")
IPV6_RE = re.compile(
    r"(?<![\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?:(?<=:)(?:\d{1,3}\.){3}\d{1,3})?(?![\w:]|\.\w)"
)
VERSION_WORDS = (
    "versions?", "ver", "v", "releas(?:e[sd]?|ing)", "build", "rev", "revision", "firmware", "updat(?:e[sd]?|ing)",
    "upgrad(?:e[sd]?|ing)", "bump(?:ed|s)?", "patch", "kernel", "sections?", "sec", "chapter", "ch",
)  # fmt: skip
_VERSION_WORD_STARTS = "".join(sorted({word[0] for word in VERSION_WORDS}))
# what just before a dotted quad makes it a version or section number (the module docstring lists the forms); the
# words' first letters are tested first: a class test per word start, where the IGNORECASE alternation costs twice
VERSION_CONTEXT_RE = re.compile(
    rf"(?:\b(?=[{_VERSION_WORD_STARTS}])(?:{'|'.join(VERSION_WORDS)})"
    r"(?:\s+(?:is|was|to|as))?\.?\s*[:#]?\s*"
    r"|§\s*"
    r"|\blib[a-z\d][\w+.-]*\s+"  # libfoo 12.4.0.1
    r"|\b[A-Za-z][\w.+-]*[/-]"  # Chrome/120.0.0.0, foo-3.14.15.92
    r"|[=!~<>]==?\s*"  # numpy==1.26.4.2; a single `=` is a setting (host=93.184.216.34)
    r"|(?<![^\n])#{1,6}\s*\[?"  # a changelog heading: ## [2.10.14.3]
    r")$",
    re.IGNORECASE,
)
VERSION_CONTEXT_CHARS = 24  # characters before a dotted quad that VERSION_CONTEXT_RE and IP_CONTEXT_RE look at
# what just after a dotted quad makes it a version: a pre-release or build part, a version word, a changelog date
VERSION_SUFFIX_RE = re.compile(
    r"[-.~](?:(?:alpha|beta|rc|pre|preview|dev|post|snapshot|nightly|final|release|stable|ga)\d*|[abmr]\d+)\b"
    r"|\+[0-9A-Za-z]|\s+(?:release|version|build)s?\b|\s+\(\d{4}-\d\d-\d\d",
    re.IGNORECASE,
)
# what makes a quad of values below 10 an address all the same: a URL's host, a login, an address word or key before
IP_CONTEXT_RE = re.compile(
    r"(?:://|@|(?:\b|_)(?:ip|ipv4|address(?:es)?|addr|host(?:name)?|server|ping|nameserver|dns|gateway|inet|proxy)"
    r"(?:\s+(?:is|was))?[\"']?\s*[:=]?\s*[\"']?)$",
    re.IGNORECASE,
)
PORT_RE = re.compile(r"(?::|\s+port\s+)\d{2,5}(?!\d)")  # ... or a port after
PHONE_RE = re.compile(
    r"(?<![\w+.-])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]\d{2,8}){1,4}"
    r"|\(\d{3}\)[ ]?\d{3}[.-]\d{4}|\d{3}([.-])\d{3}\1\d{4})(?![\w-]|\.\d)"
)
PHONE_DIGITS = (8, 15)  # digits an international number has (E.164: at most 15)

# the prechecks start with a literal character: re scans for it at C speed (a leading class is much slower)
AT_RE = re.compile(r"@(?<=\w@)\w")
DIGIT_DOT_RE = re.compile(r"\.(?<=\d\.)\d")
HEX_COLON_RE = re.compile(r":[0-9A-Fa-f]{0,4}:")
THREE_DIGITS_RE = re.compile(r"\d{3}")


def _is_email(m: re.Match) -> bool:
    domain, tld = m.group(1), m.group(2)
    return not (domain.count(".") == 1 and tld.lower() in FILE_EXTENSIONS)


def _in_scope(address: ipaddress.IPv4Address | ipaddress.IPv6Address, public_only: bool) -> bool:
    return address.is_global or not public_only


def _ipv4_checker(public_only: bool) -> Callable[[re.Match], bool]:
    def is_ip(m: re.Match) -> bool:
        text, start, end = m.string, m.start(), m.end()
        window = max(0, start - VERSION_CONTEXT_CHARS)
        octets = [int(part) for part in m.group().split(".")]
        if max(octets) < 10 and not (IP_CONTEXT_RE.search(text, window, start) or PORT_RE.match(text, end)):
            return False
        if VERSION_SUFFIX_RE.match(text, end) or VERSION_CONTEXT_RE.search(text, window, start):
            return False
        return _in_scope(ipaddress.IPv4Address(bytes(octets)), public_only)

    return is_ip


def _ipv6_checker(public_only: bool) -> Callable[[re.Match], bool]:
    def is_ip(m: re.Match) -> bool:
        candidate = m.group()
        if not any(c.isdigit() for c in candidate):
            return False
        try:
            address = ipaddress.IPv6Address(candidate)
        except ValueError:
            return False
        return _in_scope(address, public_only)

    return is_ip


def _is_phone(m: re.Match) -> bool:
    digits = sum(c.isdigit() for c in m.group())
    return PHONE_DIGITS[0] <= digits <= PHONE_DIGITS[1] or not m.group().startswith("+")


@dataclass(frozen=True, kw_only=True)
class _Rule:
    kind: str
    pattern: re.Pattern
    accept: Callable[[re.Match], bool]
    placeholder: str
    trigger: str
    """A character every match holds ('' for none): texts without it are skipped by a substring test."""
    precheck: re.Pattern
    """A cheap search a text with a match passes."""

    def apply(self, text: str, counts: Counter | None) -> str:
        if self.trigger not in text or self.precheck.search(text) is None:
            return text
        found = 0

        def replace(m: re.Match) -> str:
            nonlocal found
            if not self.accept(m):
                return m.group()
            found += 1
            return self.placeholder

        masked = self.pattern.sub(replace, text)
        if not found:
            return text  # the same object: the caller tells a change by identity
        if counts is not None:
            counts[f"pii_{self.kind}"] += found
        return masked


class PiiMasker:
    """The enabled rules of one settings, in the order they run: e-mail (its domain may look like an IP), IPv6
    (before IPv4, so an embedded IPv4 tail goes with its address), IPv4, phone."""

    def __init__(self, phone: bool, public_ips_only: bool, email: str, ip: str, phone_placeholder: str):
        rules = [
            _Rule(
                kind="email",
                pattern=EMAIL_RE,
                accept=_is_email,
                placeholder=email,
                trigger="@",
                precheck=AT_RE,
            ),
            _Rule(
                kind="ip_address",
                pattern=IPV6_RE,
                accept=_ipv6_checker(public_ips_only),
                placeholder=ip,
                trigger=":",
                precheck=HEX_COLON_RE,
            ),
            _Rule(
                kind="ip_address",
                pattern=IPV4_RE,
                accept=_ipv4_checker(public_ips_only),
                placeholder=ip,
                trigger=".",
                precheck=DIGIT_DOT_RE,
            ),
        ]
        if phone:
            rules.append(
                _Rule(
                    kind="phone",
                    pattern=PHONE_RE,
                    accept=_is_phone,
                    placeholder=phone_placeholder,
                    trigger="",
                    precheck=THREE_DIGITS_RE,
                )
            )
        self.rules = tuple(rules)

    def mask(self, text: str, counts: Counter | None = None) -> str:
        """`text` with every match replaced by its kind's placeholder; adds pii_<kind> per match to `counts`."""
        for rule in self.rules:
            text = rule.apply(text, counts)
        return text

    def mask_batch(self, texts: list[str], live: list[int], counts: Counter) -> None:
        """Masks `texts[i]` for each i in `live`, in place; counts the records changed as docs_pii_masked. Rule by
        rule, one list comprehension finds the texts holding its trigger character and passing its precheck (no
        Python call per text, which matters where nearly every text holds the trigger: Shakespeare's speeches, every
        one with ":" and most with ".")."""
        changed = set()
        for rule in self.rules:
            trigger, search = rule.trigger, rule.precheck.search
            for i in [i for i in live if trigger in texts[i] and search(texts[i])]:
                masked = rule.apply(texts[i], counts)
                if masked is not texts[i]:
                    texts[i] = masked
                    changed.add(i)
        counts["docs_pii_masked"] += len(changed)


@lru_cache(maxsize=8)
def _masker(phone: bool, public_ips_only: bool, email: str, ip: str, phone_placeholder: str) -> PiiMasker:
    return PiiMasker(phone, public_ips_only, email, ip, phone_placeholder)


def masker_for(settings) -> PiiMasker | None:
    """The masker of a CleanSettings (one per process and settings), None when `pii_mask` is off."""
    if not settings.pii_mask:
        return None
    return _masker(
        settings.pii_phone,
        settings.pii_ip_scope == "public",
        settings.pii_email_placeholder,
        settings.pii_ip_placeholder,
        settings.pii_phone_placeholder,
    )


def mask_text(text: str, settings) -> str:
    """`text` masked as the settings say (unchanged when masking is off): for what is shown of a record."""
    masker = masker_for(settings)
    return text if masker is None else masker.mask(text)


def placeholder_problem(placeholder: str) -> str | None:
    """Why a placeholder cannot be used (it would itself be masked, or breaks a line), None when it can."""
    if "\n" in placeholder or "\r" in placeholder:
        return "must be one line"
    every_rule = PiiMasker(True, False, "\x00", "\x00", "\x00")
    if every_rule.mask(placeholder) != placeholder:
        return "looks like an address or phone number itself (it would be masked again)"
    return None
