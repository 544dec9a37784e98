"""What several test files share: a small corpus that grows file by file, with exact and near copies of earlier
files' records planted in later ones (Latin and CJK), the run config the incremental tests use, and the
cleaned_jsonl fixtures (raw shards written from texts, the stage run over them with conservation checked)."""

import json
import random
from pathlib import Path

from tokenmill.common.io import REJECTED_FILE, dumps, iter_jsonl, record_id, record_shards
from tokenmill.common.results import read_result
from tokenmill.stages.clean import CleanSettings, clean_corpus

WORDS = [f"w{i}" for i in range(400)]
HAN = [chr(0x4E00 + i) for i in range(300)]


def text(rng: random.Random, cjk: bool) -> str:
    if cjk:
        return "".join(rng.choice(HAN) for _ in range(rng.randint(40, 80)))
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(25, 60)))


def write_batch_file(path: Path, n: int, seed: int, copies_of: list[str] = ()) -> list[str]:
    """n fresh records (Latin and CJK), then exact and near copies of `copies_of`; returns the fresh texts."""
    rng = random.Random(seed)
    fresh = [text(rng, cjk=i % 3 == 0) for i in range(n)]
    lines = [{"text": t, "title": f"t{seed}-{i}"} for i, t in enumerate(fresh)]
    for i, original in enumerate(copies_of):
        if i % 2:  # a near copy: one word or character changed at the end
            near = original[:-3] + ("zz" if " " in original else "丙丁")
            lines.append({"text": near, "title": f"near-{seed}-{i}"})
        else:
            lines.append({"text": original, "title": f"copy-{seed}-{i}"})
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    return fresh


def run_config(tokenizer_path: str = "") -> dict:
    return {
        "ops": {
            "dedup_report": {"config": {"keep": "first_seen"}},
            "tokenizer": {"config": {"vocab_size": 600, "tokenizer_path": tokenizer_path}},
            "tokenized_bins": {"config": {"training_type": "seq"}},
        }
    }


BATCH = "g1-b000001"


def materialize_batch(assets, data_root: Path, source: Path, run_config=None, raise_on_error=True):
    """`dg.materialize` of per-batch assets for the first source batch: the source's files registered as it (a
    placeholder file when a test wrote the stage inputs itself), the batch added to a test instance."""
    import dagster as dg

    from resources import Compute, CorpusSource, DataRoot
    from tokenmill.batches import read_registry, register_new_files
    from tokenmill.stages.raw.discover import source_state

    data_root = Path(data_root)
    if not read_registry(data_root).keys and Path(source).exists():
        state = source_state(Path(source).resolve(), exclude=data_root.resolve()) or {"written-by-the-test": [0, 0]}
        register_new_files(data_root.resolve(), Path(source).resolve(), state)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source_batch", [BATCH])
        return dg.materialize(
            assets,
            instance=instance,
            partition_key=BATCH,
            run_config=run_config,
            raise_on_error=raise_on_error,
            resources={
                "source": CorpusSource(path=str(source)),
                "data_root": DataRoot(root=str(data_root)),
                "compute": Compute(),
            },
        )


def published_files(data_root: Path, skip: frozenset = frozenset({"_timings.json"})) -> dict[str, bytes]:
    """Every published data file under the data root, by path: stage and batch links followed, unfinished
    (hidden) work and the run's timings left out."""
    import os

    files = {}
    for folder, dirs, names in os.walk(data_root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            if name not in skip and not name.startswith("."):
                path = Path(folder, name)
                files[str(path.relative_to(data_root))] = path.read_bytes()
    return files


# cleaned_jsonl fixtures: raw shards written from texts, and the stage run over them with conservation checked


def make_raw(folder: Path, texts, metas=None, per_shard=None, extra=None) -> list[str]:
    """Writes texts as raw_records shards (part-XXXXX.jsonl); returns their ids in order."""
    folder.mkdir(parents=True, exist_ok=True)
    per_shard = per_shard or max(1, len(texts))
    ids, lines = [], {}
    for i, text in enumerate(texts):
        rid = record_id("fixture.jsonl", line=i + 1)
        rec = {
            "id": rid,
            "text": text,
            "meta": (metas[i] if metas else {}),
            "source": {"path": "fixture.jsonl", "line": i + 1},
        }
        if extra and i in extra:
            rec.update(extra[i])
        ids.append(rid)
        lines.setdefault(i // per_shard, []).append(dumps(rec))
    for k, ls in lines.items():
        (folder / f"part-{k:05d}.jsonl").write_text("\n".join(ls) + "\n", encoding="utf-8")
    return ids


def clean(tmp_path: Path, texts, metas=None, workers=1, name="out", per_shard=None, extra=None, **settings):
    raw = tmp_path / f"raw-{name}"
    ids = make_raw(raw, texts, metas, per_shard, extra)
    out = tmp_path / name
    stats = clean_corpus(raw, out, CleanSettings(**settings), workers=workers)
    recs = {r["id"]: r for shard in record_shards(out) for r in iter_jsonl(shard)}
    rej = {r["id"]: r for r in iter_jsonl(out / REJECTED_FILE)}
    assert stats.docs_in == len(texts) == len(recs) + len(rej)  # conservation, always
    assert read_result(out, type(stats)) == stats
    return ids, recs, rej, stats


def mojibake(text: str) -> str:
    """UTF-8 bytes read as Windows-1252 (ftfy's sloppy codec maps the 5 undefined bytes too)."""
    import ftfy.bad_codecs  # noqa: F401  registers "sloppy-windows-1252"

    return text.encode("utf-8").decode("sloppy-windows-1252")


POEM = "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。"

JUEJU = "白日依山尽\n黄河入海流\n欲穷千里目\n更上一层楼"  # 20 characters, 4 lines of 5: valid

PROSE = (
    "The committee met on Tuesday to discuss the new budget for the library. Several members asked for more "
    "money for the children's section, and the chair promised a report by the end of the month."
)


def planted_corpus(n=300, seed=7):
    """Documents of varied length with planted header/footer boilerplate, a frequent genuine line at random
    positions, frequent words, and speaker labels locked at the top (genuine structure)."""
    rng = random.Random(seed)
    words = (
        "river moon spring wind mountain Transformer attention cloud lantern bridge willow harbor "
        "春 月 风 花 雪 山 水 云"
    ).split()
    header = "Copyright © 2024 Example Press | All rights reserved"
    footer = "Read more at https://example.com/poems"
    cn_header = "【本文来自网络 | 转载请注明出处】"
    genuine = "And still the river runs to the sea."
    speakers = ["ROMEO:", "JULIET:", "FIRST CITIZEN:", "NURSE:"]
    docs, planted, genuine_docs = [], {}, []
    for i in range(n):
        body = [
            " ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + f" {i}." for _ in range(rng.randint(2, 12))
        ]
        if i % 5 == 0:
            body.insert(rng.randint(0, len(body)), genuine)
            genuine_docs.append(i)
        if i % 7 == 3:
            body.insert(0, rng.choice(speakers))
        lines = list(body)
        plant = []
        if i % 6 == 0:
            lines.insert(0, header)
            plant.append(header)
        if i % 6 == 1:
            lines.append(footer)
            plant.append(footer)
        if i % 6 == 2:
            lines.insert(0, cn_header)
            plant.append(cn_header)
        planted[i] = plant
        docs.append("\n".join(lines))
    return docs, planted, genuine_docs, genuine, speakers


# dedup fixtures: poems of Han characters as records (indexed sources), written as cleaned shards, with planted
# exact copies and one-substitution near copies

POEM_CHARS = "春江潮水连海平明月共生滟随波千万里何处无光流宛转绕芳甸照花林皆似霰空中霜飞不觉汀上白沙看见"


def dedup_record(path: str, index: int, text: str, meta: dict | None = None) -> dict:
    return {
        "id": record_id(path, index=index),
        "text": text,
        "meta": meta or {},
        "source": {"path": path, "index": index},
    }


def random_poem(rng: random.Random, n: int = 28) -> str:
    return "".join(rng.choice(POEM_CHARS) for _ in range(n))


def write_records(folder: Path, records: list[dict], per_shard: int = 10**9) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(0, max(len(records), 1), per_shard):
        with open(folder / f"part-{s // per_shard:05d}.jsonl", "w", encoding="utf-8") as f:
            for r in records[s : s + per_shard]:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return folder


def substitute(text: str, pos: int, ch: str = "龍") -> str:
    return text[:pos] + ch + text[pos + 1 :]


def planted_dedup_corpus(seed: int = 0) -> tuple[list[dict], dict]:
    """200 distinct poems in a.json; b.json: 30 exact copies (punctuated), 20 one-substitution variants."""
    rng = random.Random(seed)
    base = [random_poem(rng, 40) for _ in range(200)]  # one substitution: Jaccard ~0.9, caught with p > 0.9998
    recs = [dedup_record("a.json", i, t, {"title": f"t{i}"}) for i, t in enumerate(base)]
    truth = {"exact": set(), "near": set()}
    for i in range(30):
        t = base[i]
        r = dedup_record("b.json", i, f"{t[:14]}，{t[14:]}。", {"title": f"t{i}", "author": "someone"})
        recs.append(r)
        truth["exact"].add(r["id"])
    for i in range(30, 50):
        r = dedup_record("b.json", i, substitute(base[i], 9))
        recs.append(r)
        truth["near"].add(r["id"])
    return recs, truth


def kept_ids(folder: Path) -> set:
    """The ids of the records in the record shards of `folder` (a deduped_jsonl output)."""
    return {r["id"] for f in record_shards(folder) for r in iter_jsonl(f)}


def two_batch_graph(root: Path) -> tuple[Path, list[str]]:
    """The whole graph, run in two source batches under `root` (a fresh folder), and a.jsonl's first 40 texts.
    a.jsonl: 40 records, an exact copy of its record 1 (line 41), a near copy of record 2 (42), a line that is not
    JSON (43), a too-short text (44); then b.jsonl: 40 records, exact and near copies of a.jsonl's 3 and 4."""
    import dagster as dg

    from assets.batches import register_batches
    from definitions import build_defs
    from resources import CorpusSource, DataRoot
    from runs import run_batches

    source, data = root / "src", root / "data"
    source.mkdir()

    def update(instance) -> None:
        defs = build_defs(CorpusSource(path=str(source)), DataRoot(root=str(data)))
        pending, _ = register_batches(instance, data, source, False)
        for key, result in run_batches(defs.resolve_job_def("tokenmill_all"), instance, pending, run_config()):
            assert result.success, key

    first = write_batch_file(source / "a.jsonl", 40, seed=1)
    write_batch_file(source / "a.jsonl", 40, seed=1, copies_of=first[:2])
    with open(source / "a.jsonl", "a", encoding="utf-8") as f:
        f.write('{"text": "cut\n' + json.dumps({"text": "short"}) + "\n")
    with dg.instance_for_test() as instance:
        update(instance)
        write_batch_file(source / "b.jsonl", 40, seed=2, copies_of=first[2:4])
        update(instance)
    return data, first


# quality models: two kinds of generated text a fastText model tells apart, and training settings small enough to
# train in well under a second
SCIENCE = (
    "the experiment measured how the cell membrane regulates ion transport across a gradient of temperature and "
    "pressure while researchers recorded the protein structure and compared the results with earlier theory"
).split()
SPAM = (
    "buy cheap pills now click here free money winner limited offer best price casino bonus hot deal discount "
    "subscribe today act fast viagra loans guaranteed"
).split()
# small enough to train in well under a second (fastText's default 2M buckets x dim is 800 MB)
FAST = {"bucket": 20_000, "dim": 16}


def paragraph(rng: random.Random, words: list[str], n: int = 60) -> str:
    sentences = []
    for _ in range(n // 12):
        sentence = " ".join(rng.choice(words) for _ in range(12))
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
    return " ".join(sentences)
