"""The one way accumrun writes a whole file: under a temporary name beside it, then renamed into place.

A reader, or a run killed at any instant, sees the old file or the new one, never half of one; what a killed writer
leaves under its temporary name, a resumed run sweeps away (:func:`sweep_leftovers`). The temporary
name keeps the target's suffix, because some writers insist on it (Keras saves only to ``.keras`` names, numpy
appends ``.npz`` to other names). It is a plain new file, so it gets the permissions of any file the user
creates (the umask), unlike ``mkstemp``'s 0600.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

_PARTIAL = ".partial"
_LEFTOVER = re.compile(rf"\..*\.(?P<pid>\d+)-[0-9a-f]{{8}}{re.escape(_PARTIAL)}")
"""A temporary name of :func:`write_atomically` (and what its writer made beside it, as Keras' ``.folder``)."""


def write_atomically(path: Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(temporary)`` to write the file, force it to disk, then move it to ``path`` in one step.

    ``write`` receives a path in ``path``'s folder that keeps ``path``'s suffix. If ``write`` raises (a failed
    checksum, a full disk, Ctrl-C), the temporary file is removed and ``path`` is left as it was.

    Returns:
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}{_PARTIAL}{path.suffix}")
    try:
        write(temporary)
        if temporary.is_file():
            with temporary.open("rb") as file:
                os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.is_dir():
            shutil.rmtree(temporary, ignore_errors=True)
        else:
            temporary.unlink(missing_ok=True)
    return path


def sweep_leftovers(folder: Path) -> None:
    """Remove what writers killed outright left in ``folder`` (not in its subfolders): :func:`write_atomically`'s
    temporary files and folders, and what a writer made beside them. A resumed run calls it, so that each kill does
    not leave another copy of the model on disk. Those of a process still alive on this machine are kept."""
    for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
        match = _LEFTOVER.match(entry.name)
        if match is None or _alive(int(match["pid"])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; no pid that large
        return False
    except PermissionError:  # another user's process
        return True
    return True


def write_text_atomically(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`write_atomically`."""
    return write_atomically(path, lambda temporary: temporary.write_text(text))


def build_once(folder: Path, complete: Callable[[Path], bool], build: Callable[[Path], object]) -> None:
    """Make sure ``folder`` is complete: found so, or built by ``build(temporary)`` beside it and renamed into place
    (:func:`write_atomically`), the way a cache folder is made. A folder at the name that ``complete`` refuses (left
    by hand, or damaged) is removed first. Several processes may build the same folder at once: the first rename
    wins, and the others find its folder complete.

    Raises:
        OSError: the folder could not be built, and no other process built it.
    """
    if complete(folder):
        return
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.exists() and not complete(folder):  # asked again: another process may have just finished it
            shutil.rmtree(folder)
        write_atomically(folder, build)
    except OSError:
        if not complete(folder):
            raise
