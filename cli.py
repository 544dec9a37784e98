"""`tokenmill` command line: `update` (every asset up to date with the source, with a short summary),
`lineage` (token position -> source record), `explain` (a record's fate through the graph), `trace` and `where` (a
training step -> its records and source lines; a record or source file -> the steps that saw it) and `train-quality`
(a fastText quality classifier from positive and negative example files)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenmill", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    lin = sub.add_parser("lineage", help="token position -> document id, source file and line, folded duplicates")
    lin.add_argument("position", type=int, help="token position in the split's token stream")
    lin.add_argument("--split", default="train")
    lin.add_argument("--key", default=None, help="token key (default: the dataset's first token key)")
    lin.add_argument(
        "--dataset-version", type=int, default=None, help="the version a training run read (default: the latest)"
    )
    default_data = os.environ.get("TOKENMILL_DATA", str(Path(__file__).resolve().parent / "data"))
    lin.add_argument("--data", default=default_data, help="data root (default: $TOKENMILL_DATA or ./data)")
    exp = sub.add_parser(
        "explain", help="a record's fate: the stage that dropped it and why, or the duplicate it folded into"
    )
    exp.add_argument("id", help="record id, or PATH:N (source file and line or index)")
    exp.add_argument("--data", default=default_data, help="data root (default: $TOKENMILL_DATA or ./data)")
    fgt = sub.add_parser(
        "forget",
        help="a takedown: the next tokenized_bins version without the named records (only their shards re-packed), "
        "kept out of later batches by id and text; the materialized exports written again from it",
    )
    named = fgt.add_mutually_exclusive_group(required=True)
    named.add_argument("--id", nargs="+", default=(), metavar="ID", help="record ids")
    named.add_argument("--source", nargs="+", default=(), metavar="PATH", help="source files, or folders of them")
    named.add_argument("--match", default=None, metavar="REGEX", help="records whose text matches (Python re)")
    fgt.add_argument("--with-duplicates", action="store_true", help="also the records dedup folded into them")
    fgt.add_argument("--reason", default=None, help="why (recorded in the version's removals)")
    fgt.add_argument("--by", default=None, metavar="NAME", help="who asked (recorded in the version's removals)")
    fgt.add_argument("--data", default=default_data, help="data root (default: $TOKENMILL_DATA or ./data)")
    upd = sub.add_parser(
        "update",
        help="register the new files of TOKENMILL_SOURCE as a source batch and bring every asset in "
        "TOKENMILL_DATA up to date (the tokenmill_all job per pending batch, in this process; runs are kept in "
        "the instance when DAGSTER_HOME is set)",
    )
    upd.add_argument("-c", "--config", default=None, help="run config YAML (ops: <asset>: config: ...)")
    upd.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild from the source as it is now (a new generation: needed after files already ingested "
        "changed or were removed; trains a new tokenizer; readers keep the dataset versions they opened)",
    )
    upd.add_argument(
        "--drop-batch",
        action="append",
        default=[],
        metavar="KEY",
        help="retire source batch KEY, one that failed and never published (repeatable): its partial outputs are "
        "removed, later batches no longer count it, and its files come in again as a new batch once corrected",
    )
    trq = sub.add_parser(
        "train-quality",
        help="train a fastText quality classifier (DCLM's recipe) on positive and negative texts from source files "
        "of any format tokenmill reads; writes DIR/model.bin and DIR/model.json (inputs, parameters, held-out metrics)",
    )
    trq.add_argument("--positive", nargs="+", required=True, type=Path, metavar="PATH", help="files or folders")
    trq.add_argument("--negative", nargs="+", required=True, type=Path, metavar="PATH", help="files or folders")
    trq.add_argument("--out", required=True, type=Path, metavar="DIR")
    trq.add_argument("--held-out-share", type=float, default=None, help="share of each class kept for the metrics")
    trq.add_argument("--epoch", type=int, default=None)
    trq.add_argument("--lr", type=float, default=None)
    trq.add_argument("--dim", type=int, default=None)
    trq.add_argument("--word-ngrams", type=int, default=None)
    trq.add_argument("--bucket", type=int, default=None, help="hash buckets of the n-gram features")
    trq.add_argument("--seed", type=int, default=None)
    for name, text in (
        (
            "trace",
            "a training step -> its samples: each window's records, token spans, file:line and folded duplicates",
        ),
        ("where", "a record or a source file -> every epoch, step, rank and row whose window holds its tokens"),
    ):
        cmd = sub.add_parser(name, help=text)
        if name == "trace":
            cmd.add_argument("--step", type=int, required=True, help="the run's step (0: its first batch)")
            cmd.add_argument("--rank", type=int, default=None, help="one rank's batch (default: every rank's)")
        else:
            cmd.add_argument("id", nargs="?", help="record id, or PATH:N (source file and line or index)")
            cmd.add_argument("--source", default=None, metavar="PATH", help="every record of a source file")
            cmd.add_argument("--epochs", type=int, default=1, help="epochs of the run to search (default 1)")
        cmd.add_argument("--seq-len", type=int, default=2049, help="TokenDataset seq_len (default 2049: L + 1)")
        cmd.add_argument("--stride", type=int, default=None, help="TokenDataset stride (default: seq_len - 1)")
        cmd.add_argument("--batch-size", type=int, default=32, help="DataLoader batch_size per rank")
        cmd.add_argument("--seed", type=int, default=0)
        cmd.add_argument("--no-shuffle", action="store_true")
        cmd.add_argument("--world", type=int, default=1, help="world_size: data-parallel ranks")
        cmd.add_argument("--workers", type=int, default=0, help="num_workers (names the worker of each batch)")
        cmd.add_argument("--drop-last", action="store_true")
        cmd.add_argument("--state", type=Path, default=None, help="JSON loader state the run resumed from")
        cmd.add_argument("--resumed-at", type=int, default=0, help="the run's step of the first batch after --state")
        cmd.add_argument("--split", default="train")
        cmd.add_argument("--dataset-version", type=int, default=None, help="default: the state's, else the latest")
        cmd.add_argument("--json", action="store_true", help="everything, as JSON")
        cmd.add_argument("--data", default=default_data, help="data root (default: $TOKENMILL_DATA or ./data)")
    pub = sub.add_parser(
        "publish",
        help="upload a dataset version (shards, meta, checksums; current.json last) to object storage, resuming "
        "what a killed publish left, then apply retention there; read it with open_store('s3://.../train', "
        "cache_dir=...) (docs/publish.md)",
    )
    pub.add_argument("--to", required=True, metavar="URL", help="s3://bucket/prefix (credentials: the AWS_* variables)")
    pub.add_argument("--dataset-version", type=int, default=None, help="default: the one tokenized_bins publishes")
    pub.add_argument("--retention-hours", type=float, default=None, help="default: tokenized_bins' (24)")
    pub.add_argument("--keep-versions", type=int, default=None, help="default: tokenized_bins' (1)")
    pub.add_argument("--data", default=default_data, help="data root (default: $TOKENMILL_DATA or ./data)")
    args = parser.parse_args(argv)
    if args.command == "publish":
        from tokenmill.publish import publish_command

        chosen = {"retention_hours": args.retention_hours, "keep_versions": args.keep_versions}
        options = {k: v for k, v in chosen.items() if v is not None}
        return publish_command(Path(args.data) / "tokenized_bins", args.to, version=args.dataset_version, **options)

    if args.command in ("trace", "where"):
        return trace_command(args)

    if args.command == "update":
        from runs import update

        return update(args.config, rebuild=args.rebuild, drop_batches=tuple(args.drop_batch))
    if args.command == "train-quality":
        return train_quality(args)
    if args.command == "forget":
        from tokenmill.forget import forget_command

        return forget_command(args)
    if args.command == "explain":
        from tokenmill.explain import explain, render

        fate = explain(Path(args.data), args.id)
        if fate is None:
            print(f"tokenmill explain: no record {args.id} in {args.data}", file=sys.stderr)
            return 2
        print(render(fate))
        return 0
    if args.command == "lineage":
        from tokenmill.lineage import locate_token
        from tokenmill_loader import DatasetError

        try:
            found = locate_token(Path(args.data), args.position, args.split, args.key, args.dataset_version)
        except (DatasetError, FileNotFoundError, IndexError, KeyError) as e:  # a missing split, an unknown key
            print(f"tokenmill lineage: {e}", file=sys.stderr)
            return 2
        print(json.dumps(found, ensure_ascii=False, indent=2))
    return 0


def trace_command(args: argparse.Namespace) -> int:
    from tokenmill.trace import LoaderSettings, render_trace, render_where, trace, where
    from tokenmill_loader import DatasetError

    try:
        settings = LoaderSettings(
            seq_len=args.seq_len,
            stride=args.stride,
            batch_size=args.batch_size,
            seed=args.seed,
            shuffle=not args.no_shuffle,
            world_size=args.world,
            num_workers=args.workers,
            drop_last=args.drop_last,
            state=json.loads(args.state.read_text(encoding="utf-8")) if args.state else None,
            resumed_at=args.resumed_at,
        )
        data = Path(args.data)
        if args.command == "trace":
            found = trace(data, args.step, settings, args.rank, args.split, args.dataset_version)
        else:
            found = where(data, settings, args.id, args.source, args.epochs, args.split, args.dataset_version)
    except (DatasetError, OSError, ValueError, KeyError) as e:  # a missing split or state file, bad settings
        print(f"tokenmill {args.command}: {e}", file=sys.stderr)
        return 2
    render = render_trace if args.command == "trace" else render_where
    try:
        print(json.dumps(found, ensure_ascii=False, indent=2) if args.json else render(found))
        sys.stdout.flush()
    except BrokenPipeError:  # `| head` read what it wanted: no traceback, and none again when Python exits
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def train_quality(args: argparse.Namespace) -> int:
    from tokenmill.errors import TokenmillError
    from tokenmill.quality_training import train_quality_model
    from tokenmill.stages.quality_model import QualityTrainSettings

    given = {
        name: getattr(args, name)
        for name in ("held_out_share", "epoch", "lr", "dim", "word_ngrams", "bucket", "seed")
        if getattr(args, name) is not None
    }
    try:
        card = train_quality_model(args.positive, args.negative, args.out, QualityTrainSettings(**given))
    except TokenmillError as e:
        print(f"tokenmill {e}", file=sys.stderr)
        return 2
    m = card.metrics
    print(
        f"held out {m['held_out']['positive']} positive, {m['held_out']['negative']} negative: ROC AUC "
        f"{m['roc_auc']:.4f}; at threshold {m['threshold']:.4f} precision {m['precision']:.4f}, recall "
        f"{m['recall']:.4f}"
    )
    print(f"model {card.model_id}: {args.out / card.model_file} (card: {args.out / 'model.json'})")
    for warning in m["warnings"]:
        print(f"tokenmill train-quality: warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
