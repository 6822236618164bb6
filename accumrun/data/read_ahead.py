"""Chunks read in a thread of its own, ahead of the caller: while the step trains on what it was given, the chunks
it will ask for next are read (the reads release the GIL), as a prefetched pipeline's would be."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

Key = TypeVar("Key", bound=Hashable)
Chunk = TypeVar("Chunk")


class ReadAhead(Generic[Key, Chunk]):
    """``read`` (one chunk by its key) run one chunk at a time in a reader thread, in the order the chunks are
    asked for."""

    def __init__(self, read: Callable[[Key], Chunk]) -> None:
        self._read = read
        self._reader: ThreadPoolExecutor | None = None
        self._pending: dict[Key, Future[Chunk]] = {}

    def take(self, keys: list[Key], then: list[Key]) -> list[Chunk]:
        """The chunks of ``keys``, read ahead where they were asked for as ``then`` before; then starts reading the
        chunks of ``then`` (what the caller expects to ask for next). What was read ahead for neither is dropped.

        Raises:
            Exception: what ``read`` raised for one of ``keys``.
        """
        for key in [key for key in self._pending if key not in keys and key not in then]:
            self._pending.pop(key).cancel()  # not waited for: the reader skips it if it has not started it
        self._start(keys)
        chunks = [self._pending.pop(key).result() for key in keys]
        self._start(then)
        return chunks

    def _start(self, keys: list[Key]) -> None:
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="accumrun-read")
        for key in keys:
            if key not in self._pending:
                self._pending[key] = self._reader.submit(self._read, key)
