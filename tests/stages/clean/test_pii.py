"""PII masking in cleaned_jsonl: each kind's positives and near misses, the settings' checks, and that no planted
address reaches any file under the data root after the graph runs (records, rejected samples, examples, metadata)."""

import json
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest
from support import clean, run_config, write_batch_file

from assets.batches import register_batches
from definitions import build_defs
from resources import CorpusSource, DataRoot
from runs import run_batches
from tokenmill.common.io import REJECTED_FILE, iter_jsonl
from tokenmill.errors import ConfigError
from tokenmill.settings import load_settings
from tokenmill.stages.clean import CleanSettings
from tokenmill.stages.clean.pii import PiiMasker, masker_for

ALL = PiiMasker(phone=True, public_ips_only=True, email="<EMAIL>", ip="<IP_ADDRESS>", phone_placeholder="<PHONE>")

MASKED = [
    ("mail john.doe@example.com today", "mail <EMAIL> today", "email"),
    ("mailto:Jane_Roe+news@mail.co.uk.", "mailto:<EMAIL>.", "email"),
    ("a@b.io, c@d.org", "<EMAIL>, <EMAIL>", "email"),
    ("x@self.weight", "<EMAIL>", "email"),  # code attribute access cannot be told from an address
    ("ping 93.184.216.34 now", "ping <IP_ADDRESS> now", "ip_address"),
    ("http://93.184.216.34/x", "http://<IP_ADDRESS>/x", "ip_address"),
    ("from 8.8.4.40.", "from <IP_ADDRESS>.", "ip_address"),
    ("via 2001:4860:4860::8888 and", "via <IP_ADDRESS> and", "ip_address"),
    ("mapped ::ffff:93.184.216.34", "mapped <IP_ADDRESS>", "ip_address"),
    ("call +1 415 555 2671 now", "call <PHONE> now", "phone"),
    ("call (415) 555-2671", "call <PHONE>", "phone"),
    ("call 415-555-2671.", "call <PHONE>.", "phone"),
    ("ruf +49 30 1234567 an", "ruf <PHONE> an", "phone"),
]

NEAR_MISSES = [
    "user@localhost",  # no dot in the domain
    "root@server",
    "@app.route('/') and @property",  # decorators
    "cc @alice please",  # a mention
    "icon@2x.png and logo@3x.svg",  # retina images
    "lodash@4.17.21",  # a package version
    "a@b.T",  # matrix product and a one-letter attribute
    "version 1.2.3.4",  # a version by context
    "release 93.184.216.34",
    "Chrome/120.0.0.0 Safari/537.36",  # a user-agent version
    "v10.20.30.40",
    "section 10.2.3.4 and § 3.1.4.15",
    "1.2.3.4 and 3.1.4.1",  # single-digit parts: section or version numbers
    "1.12.123.45.6",  # five parts
    "01.02.03.04",  # values below 10, zero-padded
    "dated 2023.01.02 and 2023-01-02",  # dates
    "server 192.168.1.1, 10.0.0.5, 127.0.0.1",  # private and loopback (pii_ip_scope public)
    "doc 203.0.113.5 and 2001:db8::1",  # documentation ranges
    "loopback ::1 and fe80::1",
    "mac 00:1a:2b:3c:4d:5e",
    "at 12:30:45 today",
    "std::vector<int> and dead::beef",
    "ISBN 978-3-16-148410-0 and 1990-2000",
    "<EMAIL> <IP_ADDRESS> <PHONE>",  # masking is idempotent
]


EVERY = PiiMasker(phone=False, public_ips_only=False, email="<EMAIL>", ip="<IP>", phone_placeholder="<PHONE>")

VERSIONS_AND_ADDRESSES = [  # (text, masked with pii_ip_scope all)
    ("We released 2.10.14.3", "We released 2.10.14.3"),
    ("libfoo 12.4.0.1", "libfoo 12.4.0.1"),
    ("numpy==1.26.4.2", "numpy==1.26.4.2"),
    (
        "pip install 'foo>=2.10.14.3', bar~=12.4.0.1, baz!=1.26.4.2",
        "pip install 'foo>=2.10.14.3', bar~=12.4.0.1, baz!=1.26.4.2",
    ),
    ("foo-3.14.15.92.tar.gz", "foo-3.14.15.92.tar.gz"),
    ("Upgraded to 4.12.0.1 last week", "Upgraded to 4.12.0.1 last week"),
    ("build 4.12.0.1-rc2 and 4.12.0.10-beta1", "build 4.12.0.1-rc2 and 4.12.0.10-beta1"),
    ("tagged 1.2.3.40+build.7, 5.3.10.1.RELEASE", "tagged 1.2.3.40+build.7, 5.3.10.1.RELEASE"),
    (
        "## [2.10.14.3] - 2024-01-02\n* 12.4.0.1 (2023-12-01): fix",
        "## [2.10.14.3] - 2024-01-02\n* 12.4.0.1 (2023-12-01): fix",
    ),
    ("the 2.10.14.3 release notes", "the 2.10.14.3 release notes"),
    ("v1.2.3.4, V 10.20.30.40, 2.10.14.3.5", "v1.2.3.4, V 10.20.30.40, 2.10.14.3.5"),
    ("Chrome 120.0.6099.109, Mozilla/5.0 Chrome/120.0.0.0", "Chrome 120.0.6099.109, Mozilla/5.0 Chrome/120.0.0.0"),
    ("upgrade from 1.2.3.4 to 1.2.3.5", "upgrade from 1.2.3.4 to 1.2.3.5"),  # values below 10, no address context
    ("256.1.1.1 and 192.168.0001.1", "256.1.1.1 and 192.168.0001.1"),  # a part over 255, a part of 4 digits
    ("045.033.032.156", "<IP>"),  # zero-padded
    ("from 192.168.001.010", "from <IP>"),
    ("connect to 10.0.0.1:8080", "connect to <IP>:8080"),
    ("IP 8.8.8.8.", "IP <IP>."),
    ("http://1.2.3.4/x and 1.2.3.4:8080", "http://<IP>/x and <IP>:8080"),
    ("Your IP is 8.8.8.8; from 8.8.8.8 port 22", "Your IP is <IP>; from <IP> port 22"),
    ('{"client_ip": "1.2.3.4"}', '{"client_ip": "<IP>"}'),
    ("ssh root@93.184.216.34 or root@1.2.3.4", "ssh root@<IP> or root@<IP>"),  # `@` is no version join
    ("host=93.184.216.34 port=5432", "host=<IP> port=5432"),  # nor is a single `=`
    (
        '93.184.216.34 - - [10/Oct/2023:13:55:36 +0000] "GET / HTTP/1.1" 200',
        '<IP> - - [10/Oct/2023:13:55:36 +0000] "GET / HTTP/1.1" 200',
    ),
    ("range 93.184.216.1-93.184.216.9", "range <IP>-<IP>"),  # a `-` join needs a name
]


@pytest.mark.parametrize("text,masked", VERSIONS_AND_ADDRESSES)
def test_versions_stay_and_addresses_are_masked_in_any_form(text, masked):
    assert EVERY.mask(text) == masked


def test_zero_padded_parts_are_read_as_decimal_for_the_scope():
    assert ALL.mask("045.033.032.156 192.168.001.010 010.000.000.001") == "<IP_ADDRESS> 192.168.001.010 010.000.000.001"


@pytest.mark.parametrize("text,masked,kind", MASKED)
def test_each_kind_is_masked_and_counted(text, masked, kind):
    counts = Counter()
    assert ALL.mask(text, counts) == masked
    assert set(counts) == {f"pii_{kind}"}


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_near_misses_stay(text):
    counts = Counter()
    assert ALL.mask(text, counts) == text and not counts


def test_plain_addresses_agree_with_datatrove():
    """datatrove's PIIFormatter (the reference; bench extra) masks the same plain addresses; the near misses above
    are where tokenmill deliberately differs (it masks `user@2x.png`, `version 93.184.216.34`)."""
    pii = pytest.importorskip("datatrove.pipeline.formatters.pii", reason="datatrove is a bench-only dependency")
    theirs = pii.PIIFormatter(email_replacement="<EMAIL>", ip_replacement="<IP_ADDRESS>")
    ours = masker_for(CleanSettings())
    for text in ("mail john.doe@example.com or ops@mail.co.uk", "ping 93.184.216.34 or 8.26.56.26", "at 10.0.0.1"):
        assert ours.mask(text) == theirs.format(text)


def test_phone_is_off_and_private_ips_kept_by_default():
    masker = masker_for(CleanSettings())
    assert masker.mask("call 415-555-2671") == "call 415-555-2671"
    assert masker.mask("at 192.168.1.1 or 93.184.216.34") == "at 192.168.1.1 or <IP_ADDRESS>"
    every = masker_for(CleanSettings(pii_ip_scope="all", pii_ip_placeholder="[ip]"))
    assert every.mask("at 192.168.1.1 or ::1") == "at [ip] or [ip]"
    assert masker_for(CleanSettings(pii_mask=False)) is None


@pytest.mark.parametrize(
    "field,value",
    [
        ("pii_email_placeholder", "mask@example.com"),
        ("pii_ip_placeholder", "0.0.0.0 x 93.1.2.3"),
        ("pii_ip_placeholder", ""),
    ],
)
def test_placeholders_that_would_be_masked_again_are_refused(field, value):
    with pytest.raises(ConfigError, match=f"cleaned_jsonl.{field}"):
        load_settings(CleanSettings, {field: value})


def test_cleaned_records_quarantine_and_examples_never_hold_the_address(tmp_path):
    texts = [
        "Write to john.doe@example.com about the spring meeting of the club, or to 93.184.216.34.",
        "Author: Jane Roe <jane.roe@example.org>\nA poem about the sea and the wind over the harbour walls.",
        "jane.roe@example.org " + "x" * 300,  # too long: rejected before masking, its sample masked
        "Caf\u00c3\u00a9 menu, ask chef@example.net for the caf\u00c3\u00a9 specials of the evening.",  # repair
        "a@b.co",  # too short once masked
    ]
    chat = {1: {"messages": [{"role": "user", "content": "my mail is bob@example.com, help me"}]}}
    ids, recs, rej, stats = clean(tmp_path, texts, extra=chat, max_chars=200, language_id=False)
    written = "\n".join(p.read_text(encoding="utf-8") for p in (tmp_path / "out").iterdir())
    assert "@example" not in written and "93.184" not in written and "a@b.co" not in written
    assert recs[ids[0]]["text"].startswith("Write to <EMAIL> about") and "<IP_ADDRESS>" in recs[ids[0]]["text"]
    assert recs[ids[1]]["meta"]["author"] == "Jane Roe <<EMAIL>>"  # masked before the header moved into meta
    assert recs[ids[1]]["messages"][0]["content"] == "my mail is <EMAIL>, help me"
    assert rej[ids[2]]["reason"] == "too_long" and rej[ids[4]]["reason"] == "too_short"
    samples = {e["id"]: e for e in iter_jsonl(tmp_path / "out" / REJECTED_FILE)}
    assert samples[ids[2]]["text"].startswith("<EMAIL> xxx")
    assert any(e["kind"] == "repair" for e in stats.examples)
    assert stats.pii["email"] == 5 and stats.pii["ip_address"] == 1 and stats.pii["phone"] == 0
    assert stats.docs_pii_masked == 4  # the text of records 0, 1, 3, 4 (the chat field is counted per address)


def test_masking_off_keeps_the_text(tmp_path):
    ids, recs, _, stats = clean(tmp_path, ["Write to john.doe@example.com please."], pii_mask=False, language_id=False)
    assert recs[ids[0]]["text"] == "Write to john.doe@example.com please." and stats.pii["email"] == 0


ADDRESS = "planted.person@example.com"
IP = "93.184.216.34"


def test_no_planted_address_reaches_the_data_root(tmp_path):
    """The whole graph on a small corpus with addresses planted in kept, rejected, duplicated and header text."""
    source = tmp_path / "source"
    source.mkdir()
    write_batch_file(source / "a.jsonl", 60, seed=3)
    planted = [
        {"text": f"Reach {ADDRESS} or {IP} for the w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 report."},
        {"text": f"Reach {ADDRESS} or {IP} for the w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 report."},  # a copy
        {"text": f"Author: {ADDRESS}\nw5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18"},
        {"text": f"{ADDRESS}"},  # too short
    ]
    with open(source / "a.jsonl", "a", encoding="utf-8") as f:
        f.writelines(json.dumps(p) + "\n" for p in planted)
    data = tmp_path / "data"
    defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))
    config = run_config()
    config["ops"]["cleaned_jsonl"] = {"config": {"language_id": False}}
    with dg.instance_for_test() as instance:
        keys, _ = register_batches(instance, data, source.resolve())
        ((_, result),) = run_batches(defs.resolve_job_def("tokenmill_all"), instance, keys, config, raise_on_error=True)
        assert result.success
        events = [str(e.materialization.metadata) for e in result.get_asset_materialization_events()]
        assert len(events) >= 7
    leaks = []
    for path in data.rglob("*"):
        if path.is_file() and "raw_records" not in path.parts:  # raw_records holds the source as read
            content = path.read_bytes()
            leaks += [str(path) for needle in (ADDRESS, IP) if needle.encode() in content]
    assert not leaks
    assert not [e for e in events if ADDRESS in e or IP in e]
    cleaned = json.loads(next((data / "cleaned_jsonl").glob("g1-*/_stats.json")).read_text())
    assert cleaned["pii_email"] == 4 and cleaned["pii_ip_address"] == 2
    funnel = json.loads((data / "funnel_telemetry" / "funnel.json").read_text())
    assert funnel["pii_masked"]["email"] == 4 and funnel["pii_masked"]["ip_address"] == 2


def test_curated_text_has_nothing_to_mask():
    """Shakespeare and Chinese poetry samples pass through untouched (the corpora's own counts: docs/web.md)."""
    masker = masker_for(CleanSettings())
    for text in ("First Citizen:\nBefore we proceed any further, hear me speak.", "床前明月光，疑是地上霜。"):
        assert masker.mask(text) == text


def test_masking_is_byte_identical_for_any_worker_count(tmp_path: Path):
    texts = [f"record {i}: reach u{i}@example.com or 93.184.{i % 200}.34 today, thanks a lot." for i in range(400)]
    _, one, _, _ = clean(tmp_path, texts, name="w1", per_shard=100, language_id=False)
    _, two, _, _ = clean(tmp_path, texts, name="w2", per_shard=100, workers=2, language_id=False)
    assert one == two and all("@" not in r["text"] for r in one.values())
