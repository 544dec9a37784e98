"""Headless-Chromium screenshots of the Dagster UI (asset graph, funnel asset page) for docs and tests.

usage: python -m devtools.screenshots URL OUT_DIR     a running UI (exit 1 if a page shows an error)
       python -m devtools.screenshots --serve OUT_DIR   start `dagster dev` on a free port with a temporary
                                                        instance, run the whole job on $TOKENMILL_SOURCE, then shoot
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# page name -> (path, window size): the funnel page is tall so its table and chart both show.
PAGES = {
    "asset-graph": ("/assets/funnel_telemetry?view=lineage&lineageScope=upstream&lineageDepth=10", "1800,900"),
    "funnel-asset": ("/assets/funnel_telemetry", "1600,2600"),
}
# Text the Dagster UI shows when a page failed; an empty body also counts as a failure.
ERROR_MARKERS = ("Unexpected GraphQL error", "Something went wrong", "PythonError", "Page not found")
# Without the background-networking flags Chromium keeps dialing out, which this network refuses.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=25000",
]


def find_chromium() -> str | None:
    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def capture(url: str, out_png: Path, chromium: str, window: str) -> str:
    """Saves a screenshot of `url` and returns the rendered DOM text."""
    with tempfile.TemporaryDirectory() as profile:
        flags = CHROMIUM_FLAGS + [f"--user-data-dir={profile}", f"--window-size={window}"]
        subprocess.run([chromium, *flags, f"--screenshot={out_png}", url], check=True, capture_output=True, timeout=120)
    with tempfile.TemporaryDirectory() as profile:
        flags = CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]
        dom = subprocess.run([chromium, *flags, "--dump-dom", url], check=True, capture_output=True, timeout=120)
    return dom.stdout.decode("utf-8", "replace")


def take_screenshots(base_url: str, out_dir: Path, chromium: str | None = None) -> dict[str, Path]:
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shots = {}
    for name, (path, window) in PAGES.items():
        png = out_dir / f"{name}.png"
        dom = capture(base_url.rstrip("/") + path, png, chromium, window)
        found = [m for m in ERROR_MARKERS if m in dom]
        if found or "<body" not in dom or not png.exists() or png.stat().st_size < 10_000:
            raise RuntimeError(
                f"{base_url}{path}: the page shows an error or did not render ({found or 'blank'}); see {png}"
            )
        shots[name] = png
    return shots


def serve_and_shoot(out_dir: Path) -> dict[str, Path]:
    import dagster as dg

    from assets.batches import register_batches
    from devtools.dagster_server import DagsterDev
    from resources import source_from_env

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(os.environ.get("TOKENMILL_DATA", str(Path(tmp) / "data")))
        home = Path(tmp) / "dagster_home"
        with DagsterDev(home, env={"TOKENMILL_DATA": str(data)}) as server:
            with dg.DagsterInstance.from_config(str(home)) as instance:  # as `tokenmill update` registers them
                batches, _ = register_batches(instance, data, source_from_env().resolved())
            for batch in batches:
                server.run_job("tokenmill_all", partition=batch)
            return take_screenshots(server.url, out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    shots = (
        serve_and_shoot(Path(sys.argv[2]))
        if sys.argv[1] == "--serve"
        else take_screenshots(sys.argv[1], Path(sys.argv[2]))
    )
    for name, png in shots.items():
        print(f"{name}: {png}")
