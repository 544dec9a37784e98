"""PII masking benchmark: precision and recall of IPv4 masking on a labelled set of dotted quads (addresses and
version numbers, each in many contexts; generated below), and the masking's records/s on the demo corpus's texts.

usage: python benchmarks/bench_pii.py [--baseline PATH] [--repeat 30] [--show 10]

--baseline PATH: another pii.py measured beside this checkout's, e.g. the last commit's:
    git show HEAD:tokenmill/stages/clean/pii.py > /tmp/pii_before.py
Its timings interleave with the current ones (the machine is shared: a slow spell hits both), and the texts of the
curated corpora (demo_corpus, and ../shared/corpora's when present, read with raw_records' ingest) whose masked
form differs between the two are counted and the first few shown.

Scoring: one dotted quad per labelled text; it counts as masked when the IP placeholder appears in the output.
Under `pii_ip_scope: all` every labelled address should be masked; under `public` (the default) only the globally
routable ones (zero-padded parts read as decimal). Precision and recall count the masked quads, not the texts kept.
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tokenmill.common.io import iter_jsonl, record_shards  # noqa: E402
from tokenmill.stages.clean import CleanSettings  # noqa: E402
from tokenmill.stages.clean import pii as current_pii  # noqa: E402

CORPORA = [REPO / "demo_corpus" / "source"] + [
    REPO.parent / "shared" / "corpora" / name for name in ("tinyshakespeare", "chinese-poetry", "commoncrawl-sample")
]

ADDRESSES = [
    "93.184.216.34", "45.33.32.156", "151.101.1.69", "104.16.132.229", "8.26.56.26",  # public
    "10.0.0.1", "192.168.1.10", "172.16.5.4", "203.0.113.5",  # private, documentation
    "045.033.032.156", "192.168.001.010", "010.000.000.001",  # zero-padded
    "8.8.8.8", "1.2.3.4",  # values below 10
]  # fmt: skip
ADDRESS_CONTEXTS = [
    "connect to {}:8080",
    "from {}",
    "IP {}.",
    "http://{}/x",
    "curl -s https://{}:8443/api/v1/health",
    '{} - - [10/Oct/2023:13:55:36 +0000] "GET /index.html HTTP/1.1" 200 2326',
    "Oct 10 13:55:36 web1 sshd[4242]: Failed password for root from {} port 22 ssh2",
    "ssh root@{}",
    "Received: from mail.example.org ([{}]) by mx.example.net",
    "X-Forwarded-For: {}",
    "nameserver {}",
    "ping {} -c 4",
    "listen {}:443 ssl;",
    "host={} port=5432 dbname=app",
    "inet {}/24 brd 10.0.0.255 scope global eth0",
    "The attacker's address was {}, blocked at 02:14.",
    "2023-10-10,{},blocked,3",
    '{{"client_ip": "{}", "status": 403}}',
    "Allow from {}",
    "Your IP is {} (shown to you only).",
    "DNS: {}",
    "[2024-01-02 10:00:01] WARN login failed user=bob src={}",
    " 3  {}  12.3 ms  11.9 ms  12.1 ms",
    "GET http://{}/admin?x=1 HTTP/1.1",
    "proxy {} refused the connection",
]
VERSIONS = ["2.10.14.3", "12.4.0.1", "1.26.4.2", "3.14.15.92", "4.12.0.1", "120.0.0.0", "1.2.3.4"]
VERSION_CONTEXTS = [
    "numpy=={}",
    "pip install 'foo>={}'",
    "requires: bar~={}, baz!=2.0",
    "We released {} today.",
    "libfoo {}",
    "libssl-dev {} is installed",
    "foo-{}.tar.gz",
    "v{}",
    "Version {}",
    "version: {}",
    "release {}",
    "build {}-rc2",
    "Upgraded to {} last week.",
    "tagged {}+build.7",
    "## [{}] - 2024-01-02",
    "### {}",
    "* {} (2024-01-02): fixed a crash on start",
    "Firmware {} is out",
    "kernel {}",
    "Mozilla/5.0 Chrome/{} Safari/537.36",
    "Chrome {}",
    "{}.5",
    "foo {}-beta1",
    "the {} release notes",
    "npm install pkg@{}",
]


def labelled() -> list[tuple[str, str | None]]:
    """(text, address or None for a version): every address in every address context, every version in every
    version context, and some version strings that no rule should mistake (parts over 255)."""
    items: list[tuple[str, str | None]] = [(c.format(a), a) for c in ADDRESS_CONTEXTS for a in ADDRESSES]
    items += [(c.format(v), None) for c in VERSION_CONTEXTS for v in VERSIONS]
    items += [(t, None) for t in ("Chrome 120.0.6099.109", "build 4.12.0.1-rc2", "Windows 10.0.19041.1", "v1.2.3.4")]
    return items


def load_pii(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("pii_baseline", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def masker(module: ModuleType, public_only: bool):
    s = CleanSettings()
    return module.PiiMasker(False, public_only, s.pii_email_placeholder, s.pii_ip_placeholder, s.pii_phone_placeholder)


def should_mask(address: str | None, public_only: bool) -> bool:
    if address is None:
        return False
    value = ipaddress.IPv4Address(bytes(int(part) for part in address.split(".")))
    return value.is_global or not public_only


def score(module: ModuleType, items, public_only: bool, show: int) -> str:
    m, placeholder = masker(module, public_only), CleanSettings().pii_ip_placeholder
    tp = fp = fn = 0
    wrong: list[str] = []
    for text, address in items:
        masked, expected = placeholder in m.mask(text), should_mask(address, public_only)
        tp, fp, fn = tp + (masked and expected), fp + (masked and not expected), fn + (expected and not masked)
        if masked != expected and len(wrong) < show:
            wrong.append(f"      {'FP' if masked else 'FN'} {text!r}")
    precision, recall = tp / max(1, tp + fp), tp / max(1, tp + fn)
    line = f"precision {precision:.3f} ({tp}/{tp + fp}), recall {recall:.3f} ({tp}/{tp + fn})"
    return "\n".join([line, *wrong])


def corpus_texts(source: Path, tmp: Path) -> list[str]:
    from tokenmill.stages.raw import ingest

    out = tmp / source.name
    ingest(source, out)
    return [r["text"] for shard in record_shards(out) for r in iter_jsonl(shard)]


def records_per_second(modules: dict[str, ModuleType], texts: list[str], repeat: int) -> dict[str, float]:
    """mask_batch (what cleaned_jsonl calls) over all `texts`, best of `repeat`, the modules interleaved."""
    maskers = {name: masker(module, True) for name, module in modules.items()}
    best = dict.fromkeys(maskers, float("inf"))
    for _ in range(repeat):
        for name, m in maskers.items():
            batch = list(texts)
            t0 = time.perf_counter()
            m.mask_batch(batch, range(len(batch)), Counter())
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: len(texts) / seconds for name, seconds in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, help="another pii.py to measure beside this checkout's")
    ap.add_argument("--repeat", type=int, default=30, help="timing rounds (best counts)")
    ap.add_argument("--show", type=int, default=10, help="wrong calls listed per configuration")
    args = ap.parse_args()
    modules = {"current": current_pii}
    if args.baseline:
        modules = {"baseline": load_pii(args.baseline), **modules}
    items = labelled()
    n_ip = sum(a is not None for _, a in items)
    print(f"labelled set: {len(items)} texts, {n_ip} addresses, {len(items) - n_ip} versions")
    for scope in ("all", "public"):
        for name, module in modules.items():
            print(f"  pii_ip_scope {scope}, {name}: {score(module, items, scope == 'public', args.show)}")
    tmp = Path(tempfile.mkdtemp(prefix="bench_pii-"))
    try:
        corpora = {source: corpus_texts(source, tmp) for source in CORPORA if source.exists()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    demo = corpora[CORPORA[0]]
    quads = [text for text, _ in items]
    for label, texts in (("demo corpus", demo), ("labelled set (a quad in every text)", quads)):
        rates = records_per_second(modules, texts, args.repeat)
        figures = ", ".join(f"{name} {rate:,.0f}" for name, rate in rates.items())
        ratio = f" ({rates['current'] / rates['baseline'] - 1:+.1%})" if "baseline" in rates else ""
        print(f"mask_batch records/s, {label}, {len(texts):,} records, best of {args.repeat}: {figures}{ratio}")
    if "baseline" in modules:
        before, after = masker(modules["baseline"], True), masker(current_pii, True)
        for source, texts in corpora.items():
            differ = [t for t in texts if before.mask(t) != after.mask(t)]
            print(f"curated {source.relative_to(REPO.parent)}: {len(texts):,} texts, {len(differ)} masked differently")
            for text in differ[: args.show]:
                print(f"    {before.mask(text)[:120]!r}\n -> {after.mask(text)[:120]!r}")


if __name__ == "__main__":
    main()
