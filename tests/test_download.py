"""Dataset download: verified, atomic, resumable by checksum. Offline: files come from a local HTTP server."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import stat
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from accumrun.data import download
from accumrun.data.arrays import IDX_FILES, read_idx
from accumrun.data.download import download_dataset
from accumrun.data.registry import SOURCES
from accumrun.errors import ConfigError, DataError

FILENAMES = list(IDX_FILES.values())


def small_idx_gz(seed: int, shape: tuple[int, ...]) -> bytes:
    """A gzip-compressed IDX file of unsigned bytes; mtime=0 keeps the bytes (and so the MD5) reproducible."""
    count = 1
    for dim in shape:
        count *= dim
    header = bytes([0, 0, 0x08, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)
    return gzip.compress(header + bytes((seed * 31 + i) % 256 for i in range(count)), mtime=0)


PAYLOADS = {
    "train-images-idx3-ubyte.gz": small_idx_gz(1, (6, 4, 4)),
    "train-labels-idx1-ubyte.gz": small_idx_gz(2, (6,)),
    "t10k-images-idx3-ubyte.gz": small_idx_gz(3, (2, 4, 4)),
    "t10k-labels-idx1-ubyte.gz": small_idx_gz(4, (2,)),
}
GOOD_MD5 = {name: hashlib.md5(data).hexdigest() for name, data in PAYLOADS.items()}


@dataclass
class Server:
    url: str
    folder: Path
    requests: list[str] = field(default_factory=list)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # urllib honours *_proxy variables; bypass them so that requests stay on 127.0.0.1.
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """Serve PAYLOADS over HTTP on 127.0.0.1 from a daemon thread, recording each requested path."""
    served = tmp_path / "served"
    served.mkdir()
    for name, data in PAYLOADS.items():
        (served / name).write_bytes(data)
    requests: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass  # keep the test output clean

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(served)))
    # A short poll interval: shutdown() waits for the next poll, 0.5 s by default.
    thread = threading.Thread(target=partial(httpd.serve_forever, poll_interval=0.01), daemon=True)
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{httpd.server_address[1]}/", served, requests)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.endswith(".partial")]


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- tests -----------------------------------------------------------------------------------------------------


def test_good_checksums_download_all_four_files(server: Server, tmp_path: Path) -> None:
    target = tmp_path / "nested" / "mnist"  # parents are created
    messages: list[str] = []
    paths = download_dataset("mnist", target, base_url=server.url, checksums=GOOD_MD5, echo=messages.append)
    assert paths == [target / name for name in FILENAMES]
    for path in paths:
        assert path.read_bytes() == PAYLOADS[path.name]
        # The temporary file's 0600 does not leak into the data: it gets the mode a new file would get.
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~current_umask()
    assert leftovers(target) == []
    assert sorted(server.requests) == sorted(f"/{name}" for name in FILENAMES)
    assert [m.split()[0] for m in messages] == ["downloaded"] * 4
    assert f"({len(PAYLOADS[FILENAMES[0]]):,} bytes)" in messages[0]
    assert read_idx(paths[0]).shape == (6, 4, 4)  # what lands is readable by the loader


def test_bad_checksum_leaves_neither_the_file_nor_a_partial(server: Server, tmp_path: Path) -> None:
    bad = "t10k-images-idx3-ubyte.gz"
    checksums = {**GOOD_MD5, bad: "0" * 32}
    with pytest.raises(DataError, match=rf"checksum mismatch for {re.escape(bad)}") as caught:
        download_dataset("mnist", tmp_path, base_url=server.url, checksums=checksums, echo=lambda _: None)
    assert "0" * 32 in str(caught.value) and GOOD_MD5[bad] in str(caught.value)
    assert not (tmp_path / bad).exists()
    assert leftovers(tmp_path) == []


def test_second_run_keeps_verified_files_without_requests(server: Server, tmp_path: Path) -> None:
    download_dataset("mnist", tmp_path, base_url=server.url, checksums=GOOD_MD5, echo=lambda _: None)
    server.requests.clear()
    messages: list[str] = []
    download_dataset("mnist", tmp_path, base_url=server.url, checksums=GOOD_MD5, echo=messages.append)
    assert server.requests == []
    assert messages == [f"kept {tmp_path / name} (checksum ok)" for name in FILENAMES]


def test_corrupt_existing_file_is_replaced_by_a_verified_download(server: Server, tmp_path: Path) -> None:
    corrupt = tmp_path / "train-labels-idx1-ubyte.gz"
    corrupt.write_bytes(b"truncated")
    messages: list[str] = []
    download_dataset("mnist", tmp_path, base_url=server.url, checksums=GOOD_MD5, echo=messages.append)
    assert corrupt.read_bytes() == PAYLOADS[corrupt.name]
    assert f"downloaded {corrupt} ({len(PAYLOADS[corrupt.name]):,} bytes)" in messages


def test_corrupt_existing_file_survives_a_failed_verification(server: Server, tmp_path: Path) -> None:
    existing = tmp_path / "train-images-idx3-ubyte.gz"
    existing.write_bytes(b"old bytes")
    checksums = {**GOOD_MD5, existing.name: "f" * 32}  # neither the old file nor the download matches
    with pytest.raises(DataError, match="checksum"):
        download_dataset("mnist", tmp_path, base_url=server.url, checksums=checksums, echo=lambda _: None)
    assert existing.read_bytes() == b"old bytes"  # never deleted before a replacement is verified
    assert leftovers(tmp_path) == []


def test_missing_file_on_server_is_a_data_error(server: Server, tmp_path: Path) -> None:
    (server.folder / "t10k-labels-idx1-ubyte.gz").unlink()
    target = tmp_path / "out"
    with pytest.raises(DataError, match=r"cannot fetch .*t10k-labels-idx1-ubyte\.gz: HTTP 404"):
        download_dataset("mnist", target, base_url=server.url, checksums=GOOD_MD5, echo=lambda _: None)
    assert not (target / "t10k-labels-idx1-ubyte.gz").exists()
    assert leftovers(target) == []


def test_interrupt_mid_stream_removes_the_partial_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class Interrupted(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            if self.tell():
                raise KeyboardInterrupt
            return super().read(size)

    monkeypatch.setattr(download, "_CHUNK", 8)
    monkeypatch.setattr(download.urllib.request, "urlopen", lambda url, timeout: Interrupted(b"x" * 64))
    with pytest.raises(KeyboardInterrupt):
        download_dataset("mnist", tmp_path, base_url="http://unused.invalid/", echo=lambda _: None)
    assert list(tmp_path.iterdir()) == []


def test_default_base_url_is_the_official_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fetched: list[str] = []

    def fake_urlopen(url: str, timeout: float) -> io.BytesIO:
        fetched.append(url)
        return io.BytesIO(PAYLOADS[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(download.urllib.request, "urlopen", fake_urlopen)  # no real network, ever
    download_dataset("fashion_mnist", tmp_path, checksums=GOOD_MD5, echo=lambda _: None)
    assert fetched == [SOURCES["fashion_mnist"].download.url + name for name in FILENAMES]


def test_unknown_dataset_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown dataset"):
        download_dataset("cifar10", tmp_path / "never", echo=lambda _: None)
    assert not (tmp_path / "never").exists()


def test_official_checksums_cover_the_idx_files() -> None:
    downloads = {name: source.download for name, source in SOURCES.items() if source.download is not None}
    assert set(downloads) == {"mnist", "fashion_mnist"}
    for checksums in (source.md5 for source in downloads.values()):
        assert set(checksums) == set(IDX_FILES.values())
        assert all(re.fullmatch(r"[0-9a-f]{32}", md5) for md5 in checksums.values())
