"""What the UI pages say holds: each export's `usage` snippet defines every name it uses (pasted, it runs)."""

import ast
import builtins
from pathlib import Path

from tokenmill.exports import hf_parquet


def undefined_names(code: str) -> set[str]:
    """Names a snippet reads that it neither imports nor assigns (nor are builtins)."""
    tree = ast.parse(code)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def python_blocks(markdown: str) -> list[str]:
    return [block.split("\n", 1)[1] for block in markdown.split("```")[1::2] if block.startswith("python")]


def test_hf_parquet_usage_imports_what_it_uses():
    blocks = python_blocks(hf_parquet.usage(Path("/data/hf"), Path("/data/tokenizer")))
    assert blocks
    for code in blocks:
        assert undefined_names(code) == set(), code
