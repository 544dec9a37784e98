"""Named crash points for the kill harness (tests/test_kill_harness.py).

``TOKENMILL_FAILPOINT=<point>`` SIGKILLs the process that reaches ``<point>``; ``<point>@group`` kills its whole
process group (the run and its workers at once, as ``kill -9 -<pgid>`` would). Unset, a point costs one dict
lookup. Points: ``<stage>:staged``, ``<stage>:versioned``, ``<stage>:pointed`` around each stage's publish
(common/io.py) and ``tasks:<function>`` in the run process once a stage's worker tasks are running
(common/parallel.py), ``data_root:lock`` in a run's set-up once it is STARTED, before it locks its data root
(resources/__init__.py).
"""

from __future__ import annotations

import os
import signal

ENV = "TOKENMILL_FAILPOINT"


def failpoint(*names: str) -> None:
    """Kills here when the point set in the environment is one of `names` (a batch folder's publish answers to
    its stage's name as well as its own)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    point, _, scope = spec.partition("@")
    if point in names:
        if scope == "group":
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
