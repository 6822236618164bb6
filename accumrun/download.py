"""Fetch the MNIST and Fashion-MNIST IDX files, verified by MD5, without ever leaving a half-written file.

Each file is streamed into a hidden temporary file in the target folder and moved into place with one atomic
``os.replace`` only after its checksum matches, so an interrupted or corrupt download can never be mistaken for
data. Standard library only: the training extras are not needed to fetch data.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from accumrun.data import IDX_FILES, IDX_SOURCES
from accumrun.errors import ConfigError, DataError

# The published checksums: torchvision's MNIST/FashionMNIST ``resources`` and the Fashion-MNIST README.
OFFICIAL_MD5: dict[str, dict[str, str]] = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
}
_CHUNK = 1 << 20
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
    timeout: float = 60.0,
) -> list[Path]:
    """Make sure ``folder`` holds the four IDX ``.gz`` files of ``name``, each with its expected MD5.

    Files already present with the right checksum are kept without a request. A present file with a wrong
    checksum is replaced, but only by a download that has been verified.

    Args:
        name: ``mnist`` or ``fashion_mnist``.
        folder: where the files go; created (with its parents) when missing.
        base_url: where the files are served; defaults to the dataset's official source.
        checksums: expected MD5 per file name, overriding ``OFFICIAL_MD5`` for the files it names.
        echo: receives one progress line per file.
        timeout: seconds to wait for the server on each blocking network operation.

    Returns:
        The paths of the four files, in the order of ``accumrun.data.IDX_FILES``.

    Raises:
        ConfigError: ``name`` is not a known dataset.
        DataError: a file cannot be fetched or written, or its checksum does not match.
    """
    if name not in OFFICIAL_MD5:
        raise ConfigError("dataset", "unknown dataset; use mnist or fashion_mnist", name)
    expected_md5 = {**OFFICIAL_MD5[name], **(checksums or {})}
    base = (base_url or IDX_SOURCES[name]).rstrip("/")
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError("download", f"cannot create {folder}: {error}") from None
    paths = []
    for filename in IDX_FILES.values():
        path = folder / filename
        expected = expected_md5[filename].lower()
        if path.is_file() and _file_md5(path) == expected:
            echo(f"kept {path} (checksum ok)")
        else:
            size = _fetch_verified(f"{base}/{filename}", path, expected, timeout)
            echo(f"downloaded {path} ({size:,} bytes)")
        paths.append(path)
    return paths


def _fetch_verified(url: str, path: Path, expected: str, timeout: float) -> int:
    """Stream ``url`` into ``path`` via a temporary file, moving it into place only if its MD5 is ``expected``.

    Returns:
        The number of bytes written.
    """
    try:
        # In the target folder, so that the final os.replace is a rename within one file system (atomic). Closed by
        # the `with` below, yet created here: its name must outlive that block for the move or the clean-up.
        partial = tempfile.NamedTemporaryFile(dir=path.parent, prefix=".", suffix=".partial", delete=False)  # noqa: SIM115
    except OSError as error:
        raise DataError("download", f"cannot write in {path.parent}: {error}") from None
    moved = False
    try:
        # MD5 identifies the published files, it guards no secret; the flag keeps it usable on FIPS-mode systems.
        digest = hashlib.md5(usedforsecurity=False)
        size = 0
        with partial:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    while chunk := response.read(_CHUNK):
                        partial.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
            except _FETCH_ERRORS as error:
                raise DataError("download", f"cannot fetch {url}: {_reason(error)}") from None
        actual = digest.hexdigest()
        if actual != expected:
            raise DataError(
                "download", f"checksum mismatch for {path.name} from {url}: expected MD5 {expected}, got {actual}"
            )
        try:
            # NamedTemporaryFile creates 0600; give the data the permissions any new file would get.
            os.chmod(partial.name, 0o666 & ~_umask())
            os.replace(partial.name, path)
        except OSError as error:
            raise DataError("download", f"cannot move the download into {path}: {error}") from None
        moved = True
        return size
    finally:
        # On every failure, KeyboardInterrupt included, the half-written file goes; after the move it is the data.
        if not moved:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial.name)


def _file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _umask() -> int:
    # The only portable way to read the umask is to set it and put it back.
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _reason(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__
