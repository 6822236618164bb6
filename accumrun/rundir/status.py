"""``run.json``: whether a run is running, completed, interrupted or failed (and why), with its times."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import tensorflow as tf

from accumrun._version import __version__
from accumrun.rundir.atomic import write_text_atomically

# Rewritten by every session of a run; the other keys of run.json (such as the auto choice) carry over.
_PER_SESSION_KEYS = ("status", "reason", "started", "ended", "resumed", "accumrun_version", "tensorflow_version")


class RunStatus:
    """``run.json`` of one run, rewritten atomically at every change, so it is always a complete document.

    A resumed run keeps its first start time and the keys earlier sessions recorded, and adds the time it
    resumed. ``status: completed`` is what makes a folder a finished run.
    """

    def __init__(self, path: Path, *, resumed: bool = False, details: dict[str, Any] | None = None) -> None:
        self._path = path
        now = datetime.now().isoformat(timespec="seconds")
        previous = json.loads(path.read_text()) if resumed and path.is_file() else {}
        self._record: dict[str, Any] = {
            "status": "running",
            "reason": None,
            "started": previous.get("started", now),
            "ended": None,
            "resumed": previous.get("resumed", []) + ([now] if resumed else []),
            "accumrun_version": __version__,
            "tensorflow_version": tf.__version__,
            **{key: value for key, value in previous.items() if key not in _PER_SESSION_KEYS},
            **(details or {}),
        }
        self._write()

    def end(self, status: str, reason: str | None = None) -> None:
        """Record how the run ended: ``completed``, ``interrupted`` or ``failed``, with the reason."""
        self._record.update(status=status, reason=reason, ended=datetime.now().isoformat(timespec="seconds"))
        self._write()

    def _write(self) -> None:
        write_text_atomically(self._path, json.dumps(self._record, indent=2) + "\n")


def read_status(run_dir: Path) -> str | None:
    """The status recorded in ``run_dir/run.json``, or None when there is no readable one."""
    try:
        status = json.loads((run_dir / "run.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None
    return status if isinstance(status, str) else None
