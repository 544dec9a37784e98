"""python -m tokenmill_loader inspect PATH [--dtype uint16] [--verify] [--sample N]"""

from __future__ import annotations

import argparse
import json
import re
import sys

import numpy as np

from .errors import DatasetError
from .format import MASK_OF, RECORD_KEY, TOKEN_KEYS
from .store import open_store


def summary(store, sample_tokens: int = 64) -> dict:
    tt = store.training_type
    out = {
        "path": store.path,
        "type": store.kind,
        "training_type": tt,
        "keys": {k: {"dtype": str(store.dtypes[k]), "items": store.num_items(k)} for k in store.keys},
        "tokens": int(sum(store.num_items(k) for k in TOKEN_KEYS[tt] if k in store.keys)),
        "records": store.num_records,
        "documents": int(len(store.doc_starts(RECORD_KEY[tt]))) if RECORD_KEY[tt] in store.keys else 0,
        "shards": len(store.parts),
        "vocab_size": store.info.get("vocab_size"),
    }
    top = [
        int(store._array(i, k).max())
        for i in range(len(store.parts))
        for k in TOKEN_KEYS[tt]
        if k in store.parts[i].dtypes and store.parts[i].lengths[k]
    ]
    out["max_token_id"] = max(top) if top else None
    mask_keys = [k for k in MASK_OF if k in store.keys]
    if mask_keys:
        trained = sum(
            int(np.count_nonzero(store._array(i, k)))
            for k in mask_keys
            for i in range(len(store.parts))
            if k in store.parts[i].dtypes
        )
        out["supervised_tokens"] = trained
        out["masked_tokens"] = sum(store.num_items(k) for k in mask_keys) - trained
    if store.kind == "bin":  # a headerless stream: no record or document boundaries are stored
        out["records"] = out["documents"] = None
    if store.kind == "dataset":
        out["format_version"] = store.info.get("format_version")
        out["special_tokens"] = store.info.get("special_tokens")
    key = RECORD_KEY[tt]
    if store.num_records and key in store.keys:
        ids = store.read_record(0, key)[:sample_tokens]
        out["sample"] = {"record": 0, "key": key, "ids": ids.tolist()}
        tok = store.tokenizer_path()
        if tok is not None:
            try:
                from tokenizers import Tokenizer  # optional, not a dependency

                text = Tokenizer.from_file(str(tok)).decode(ids.tolist(), skip_special_tokens=False)
                out["sample"]["text"] = text.rstrip("\ufffd")  # the cut may split a multi-byte character
            except ImportError:
                out["sample"]["text"] = None
            except Exception as e:  # a tokenizer that cannot decode: report, do not fail the summary
                out["sample"]["text_error"] = str(e)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tokenmill_loader")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ins = sub.add_parser("inspect", help="JSON summary of a dataset, shard, .bin or JSONL")
    ins.add_argument("path")
    ins.add_argument("--dtype", default=None, help="token dtype of a headerless .bin (e.g. uint16)")
    ins.add_argument("--verify", action="store_true", help="check the sha256 of every file")
    ins.add_argument("--sample", type=int, default=64, help="tokens of the first record to show")
    args = ap.parse_args(argv)
    try:
        store = open_store(args.path, dtype=args.dtype, verify=args.verify)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(summary(store, args.sample), ensure_ascii=False, indent=2)
    # keep lists of numbers (sample ids) on one line
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]", lambda m: "[" + re.sub(r",\s*", ", ", m.group(1)) + "]", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
