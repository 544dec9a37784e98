"""Shared fixtures: the bundled demo corpus and its ground-truth manifest, and where ../shared lives."""

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO_DIR = REPO / "demo_corpus"
# design material and real corpora sit next to the repo (../shared) in CI and in the workspace
SHARED = (REPO.parent / "shared").resolve()


@pytest.fixture(scope="session")
def demo_source() -> Path:
    """The committed demo corpus inputs (demo_corpus/source)."""
    return DEMO_DIR / "source"


@pytest.fixture(scope="session")
def demo_manifest() -> dict:
    """demo_corpus/manifest.json: what the generator planted (counts, duplicates, garbled ids, ...)."""
    with open(DEMO_DIR / "manifest.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """../shared (design docs, tools, real corpora); tests that need it skip when it is absent."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not present")
    return SHARED
