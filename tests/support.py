"""A small corpus that grows file by file, with exact and near copies of earlier files' records planted in later
ones (Latin and CJK), and the run config the incremental tests use."""

import json
import random
from pathlib import Path

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
