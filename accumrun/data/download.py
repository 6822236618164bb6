"""Fetch the MNIST and Fashion-MNIST IDX files (:data:`accumrun.data.registry.SOURCES`), verified by MD5.

Each file is streamed into a temporary file beside it and moved into place only once its checksum matches
(:func:`accumrun.rundir.atomic.write_atomically`), so an interrupted or corrupt download is never taken for data.
"""

from __future__ import annotations

import hashlib
import http.client
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from accumrun.data.arrays import IDX_FILES
from accumrun.data.registry import DOWNLOADABLE, SOURCES
from accumrun.errors import ConfigError, DataError
from accumrun.rundir.atomic import write_atomically

_CHUNK = 1 << 20
_TIMEOUT = 60.0  # seconds to wait for the server on each blocking network operation
# What a failed fetch can raise: HTTPError < URLError < OSError (TimeoutError and connection resets are OSErrors
# too); a body cut short raises http.client.IncompleteRead; a malformed base URL raises ValueError in urlopen.
_FETCH_ERRORS = (OSError, http.client.HTTPException, ValueError)


def download_dataset(
    name: str,
    folder: Path,
    *,
    base_url: str | None = None,
    checksums: dict[str, str] | None = None,
    echo: Callable[[str], None] = print,
) -> list[Path]:
    """Make sure ``folder`` (created when missing) holds the four IDX ``.gz`` files of ``name``, each with its
    expected MD5, and return their paths in the order of ``IDX_FILES``. A file with the right checksum is kept
    without a request; one with a wrong checksum is replaced, but only by a verified download.

    Args:
        base_url: where the files are served; defaults to the dataset's official source.
        checksums: expected MD5 per file name, overriding the published ones for the files it names.

    Raises:
        ConfigError: ``name`` is not a known dataset.
        DataError: a file cannot be fetched or written, or its checksum does not match.
    """
    download = SOURCES[name].download if name in SOURCES else None
    if download is None:
        raise ConfigError("dataset", f"unknown dataset; use {' or '.join(DOWNLOADABLE)}", name)
    expected_md5 = {**download.md5, **(checksums or {})}
    base = (base_url or download.url).rstrip("/")
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError("download", f"cannot create {folder}: {error}") from None
    for filename in IDX_FILES.values():
        path = folder / filename
        expected = expected_md5[filename].lower()
        if path.is_file() and _file_md5(path) == expected:
            echo(f"kept {path} (checksum ok)")
        else:
            _fetch_verified(f"{base}/{filename}", path, expected)
            echo(f"downloaded {path} ({path.stat().st_size:,} bytes)")
    return [folder / filename for filename in IDX_FILES.values()]


def _fetch_verified(url: str, path: Path, expected: str) -> None:
    """Stream ``url`` into ``path``, which only ever holds a complete file whose MD5 is ``expected``."""

    def fetch(temporary: Path) -> None:
        # MD5 identifies the published files, it guards no secret; the flag keeps it usable on FIPS-mode systems.
        digest = hashlib.md5(usedforsecurity=False)
        with temporary.open("wb") as file:
            try:
                with urllib.request.urlopen(url, timeout=_TIMEOUT) as response:
                    while chunk := response.read(_CHUNK):
                        file.write(chunk)
                        digest.update(chunk)
            except _FETCH_ERRORS as error:
                raise DataError("download", f"cannot fetch {url}: {_reason(error)}") from None
        if digest.hexdigest() != expected:
            raise DataError(
                "download",
                f"checksum mismatch for {path.name} from {url}: expected MD5 {expected}, got {digest.hexdigest()}",
            )

    try:
        write_atomically(path, fetch)
    except OSError as error:
        raise DataError("download", f"cannot write {path}: {error}") from None


def _file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _reason(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__
