"""``run.json``: whether a run is running, completed, interrupted or failed (and why), with its times.

:class:`RunRecord` is the file as a type, with its one reader (:meth:`RunRecord.read`) and its one writer
(:meth:`RunRecord.write`); :class:`RunStatus` keeps it true while a run trains, as a context manager.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from accumrun._version import __version__
from accumrun.errors import Interrupted, WorkerLost
from accumrun.kinds import BatchNormMode, RunState
from accumrun.rundir.atomic import write_text_atomically

RUN_FILE = "run.json"

_Note = TypeVar("_Note")


@dataclass(frozen=True)
class BatchNormNote:
    """The model's BatchNorm layers and their mode: ``compare`` reads it, because with BatchNorm subdivided and
    plain runs are not expected to match."""

    layers: int
    mode: BatchNormMode


@dataclass(frozen=True)
class ProbeNote:
    """One candidate ``memory_budget`` probed: its subdivisions, peak bytes and seconds per sample (None: it ran out
    of memory), and its ``training.remat``."""

    subdivisions: int
    peak: int | None
    seconds_per_sample: float | None
    remat: str = "none"


@dataclass(frozen=True)
class AutoNote:
    """What ``subdivisions: auto`` chose, and every count it tried, in order; under a ``memory_budget`` (bytes),
    every candidate's probe."""

    chosen: int
    tried: tuple[int, ...]
    memory_budget: int | None = None
    candidates: tuple[ProbeNote, ...] = ()
    remat: str | None = None
    """The ``training.remat`` chosen with the subdivisions, under a budget."""

    def document(self) -> dict[str, Any]:
        """The note as ``run.json`` holds it (the budget's keys only under a budget)."""
        document: dict[str, Any] = {"chosen": self.chosen, "tried": list(self.tried)}
        if self.memory_budget is not None:
            document["memory_budget"] = self.memory_budget
            document["remat"] = self.remat
            document["candidates"] = [dataclasses.asdict(probe) for probe in self.candidates]
        return document

    @classmethod
    def parse(cls, document: dict[str, Any]) -> AutoNote:
        """The note from its ``run.json`` form."""
        return cls(
            int(document["chosen"]),
            tuple(document["tried"]),
            document.get("memory_budget"),
            tuple(ProbeNote(**probe) for probe in document.get("candidates", ())),
            document.get("remat"),
        )


@dataclass(frozen=True)
class RunRecord:
    """``run.json``: the run's state and why, when it started, ended and resumed, the versions it ran under, and
    what the run settled that a reader of the folder needs."""

    status: RunState
    started: str
    reason: str | None = None
    ended: str | None = None
    resumed: tuple[str, ...] = ()
    accumrun_version: str | None = None
    tensorflow_version: str | None = None
    batch_norm: BatchNormNote | None = None
    subdivisions_auto: AutoNote | None = None

    def write(self, run_dir: Path) -> None:
        """Write ``run_dir/run.json``, atomically, so it is always a complete document."""
        document: dict[str, Any] = {
            "status": self.status.value,
            "reason": self.reason,
            "started": self.started,
            "ended": self.ended,
            "resumed": list(self.resumed),
            "accumrun_version": self.accumrun_version,
            "tensorflow_version": self.tensorflow_version,
        }
        if self.batch_norm is not None:
            document["batch_norm"] = {"layers": self.batch_norm.layers, "mode": self.batch_norm.mode.value}
        if self.subdivisions_auto is not None:
            document["subdivisions_auto"] = self.subdivisions_auto.document()
        write_text_atomically(run_dir / RUN_FILE, json.dumps(document, indent=2) + "\n")

    @classmethod
    def read(cls, run_dir: Path) -> RunRecord | None:
        """``run_dir/run.json``, or None when there is no readable one (a note it cannot read is left out: the
        status still counts)."""
        try:
            document = json.loads((run_dir / RUN_FILE).read_text())
            return cls(
                status=RunState(document["status"]),
                started=str(document.get("started", "")),
                reason=document.get("reason"),
                ended=document.get("ended"),
                resumed=tuple(document.get("resumed", ())),
                accumrun_version=document.get("accumrun_version"),
                tensorflow_version=document.get("tensorflow_version"),
                batch_norm=_note(
                    document, "batch_norm", lambda n: BatchNormNote(int(n["layers"]), BatchNormMode(n["mode"]))
                ),
                subdivisions_auto=_note(document, "subdivisions_auto", AutoNote.parse),
            )
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            return None


def _note(document: dict[str, Any], key: str, parse: Callable[[Any], _Note]) -> _Note | None:
    """``document[key]`` parsed, or None when it is missing or unreadable."""
    try:
        return parse(document[key]) if document.get(key) else None
    except (ValueError, KeyError, TypeError):
        return None


def read_status(run_dir: Path) -> RunState | None:
    """The state recorded in ``run_dir/run.json``, or None when there is no readable one."""
    record = RunRecord.read(run_dir)
    return record.status if record is not None else None


def _now() -> str:
    return datetime.now().isoformat(timespec="seconds")


class RunStatus:
    """Keeps ``run_dir/run.json`` true for one session of a run: ``running`` on entry, then how it ended.

    On a clean exit the run is ``completed`` (with :attr:`reason`, why it stopped early, if it did). An exception
    is recorded and re-raised: :class:`Interrupted`, :class:`WorkerLost` and a second Ctrl-C as ``interrupted``,
    anything else as ``failed``. A resumed run keeps its first start time and what earlier sessions settled, and
    adds the time it resumed.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorflow_version: str,
        resumed: bool = False,
        batch_norm: BatchNormNote | None = None,
        subdivisions_auto: AutoNote | None = None,
    ) -> None:
        now = _now()
        previous = RunRecord.read(run_dir) if resumed else None
        self._run_dir = run_dir
        self._record = RunRecord(
            status=RunState.RUNNING,
            started=previous.started if previous is not None else now,
            resumed=(*(previous.resumed if previous is not None else ()), *((now,) if resumed else ())),
            accumrun_version=__version__,
            tensorflow_version=tensorflow_version,
            batch_norm=batch_norm or (previous.batch_norm if previous is not None else None),
            subdivisions_auto=subdivisions_auto or (previous.subdivisions_auto if previous is not None else None),
        )
        self.reason: str | None = None
        """Why a completed run stopped before its last epoch (early stopping), if it did."""

    def __enter__(self) -> RunStatus:
        self._record.write(self._run_dir)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if error is None:
            self._end(RunState.COMPLETED, self.reason)
        elif isinstance(error, Interrupted):
            self._end(RunState.INTERRUPTED, error.reason)
        elif isinstance(error, WorkerLost):
            self._end(RunState.INTERRUPTED, error.message)
        elif isinstance(error, KeyboardInterrupt):
            self._end(RunState.INTERRUPTED, "stopped at once by a second Ctrl-C; the last checkpoint is intact")
        else:
            self._end(RunState.FAILED, str(error) or type(error).__name__)

    def _end(self, status: RunState, reason: str | None) -> None:
        self._record = dataclasses.replace(self._record, status=status, reason=reason, ended=_now())
        self._record.write(self._run_dir)
