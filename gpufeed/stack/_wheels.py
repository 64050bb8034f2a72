"""Wheels read where they lie: a file list from the zip's central directory, one member at a time.

A wheel is a zip file whose table of contents (the central directory) sits at its end, so its file
list costs two HTTP range requests of a few hundred kB, whatever the wheel's size. A member's
bytes are read from its own offset and inflated as they arrive, into a temporary file that is
removed once read. What was learnt (file lists, each ELF member's dynamic section and symbols) is
cached as JSON under the cache folder, keyed by the wheel's file name (a name is one build: PyPI
never replaces a file), so a second run downloads nothing.

Standard library only (``urllib``, ``zlib``, ``struct``).
"""

from __future__ import annotations

import json
import re
import struct
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gpufeed.core import write_json

__all__ = ["Member", "RemoteWheel", "WheelError", "wheel_path"]

_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_EOCD64 = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"
_TAIL_BYTES = 1 << 16  # the end record plus the longest zip comment (65,535 bytes)
_CHUNK_BYTES = 1 << 20
_RETRIES = 3


class WheelError(RuntimeError):
    """A wheel could not be read: the network failed, or the file is not the zip it should be."""


@dataclass(frozen=True)
class Member:
    """One file in a wheel: its name, where its local header starts, its sizes and compression."""

    name: str
    offset: int
    compressed_bytes: int
    size_bytes: int
    method: int


def wheel_path(name: str) -> str | None:
    """Where a wheel member lands under site-packages, or ``None`` for data that lands elsewhere.

    ``pkg-1.0.data/purelib/x`` and ``.../platlib/x`` land at ``x``; ``scripts``, ``headers`` and
    ``data`` go outside site-packages; the ``.dist-info`` folder is metadata.
    """
    parts = name.split("/")
    if parts[0].endswith(".data"):
        return "/".join(parts[2:]) if len(parts) > 2 and parts[1] in ("purelib", "platlib") else None
    return name


def _get(url: str, start: int, end: int | None = None, *, stream: bool = False):
    """GET bytes ``start..end`` (inclusive; ``end=None``: the last ``-start`` bytes when start < 0)."""
    spec = (
        f"bytes={start}-" if end is None and start >= 0 else f"bytes={start}" if end is None else f"bytes={start}-{end}"
    )
    request = urllib.request.Request(url, headers={"Range": spec, "User-Agent": "gpufeed-stack-check"})
    for attempt in range(_RETRIES):
        try:
            response = urllib.request.urlopen(request, timeout=60)
            if response.status != 206:
                raise WheelError(f"{url}: the server ignored the byte range (HTTP {response.status})")
            if stream:
                return response
            with response:
                return response.read()
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            if attempt == _RETRIES - 1:
                raise WheelError(f"{url}: {err}") from err
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


class RemoteWheel:
    """A wheel on an index, read with range requests; what it holds is cached under ``cache``.

    Args:
        url: The wheel's URL (as pip's resolution report gives it).
        cache: Folder for the JSON this class learns (created when missing).
    """

    def __init__(self, url: str, cache: Path):
        self.url = url
        self.filename = url.rsplit("/", 1)[-1].split("#", 1)[0]
        self.cache = Path(cache) / re.sub(r"[^A-Za-z0-9._+-]", "_", self.filename)
        self._members: dict[str, Member] | None = None

    def members(self) -> dict[str, Member]:
        """Every file in the wheel, by its name in the zip."""
        if self._members is None:
            cached = self.cache / "members.json"
            if cached.is_file():
                self._members = {m[0]: Member(*m) for m in json.loads(cached.read_text())}
            else:
                self._members = self._read_central_directory()
                self.cache.mkdir(parents=True, exist_ok=True)
                write_json(
                    cached, [list(m.__dict__.values()) for m in self._members.values()], compact=True, atomic=True
                )
        return self._members

    def _read_central_directory(self) -> dict[str, Member]:
        tail = _get(self.url, -_TAIL_BYTES)
        at = tail.rfind(_EOCD)
        if at < 0:
            raise WheelError(f"{self.filename}: no zip end record in its last {_TAIL_BYTES} bytes")
        entries, cd_size, cd_offset = struct.unpack_from("<HII", tail, at + 10)
        locator = tail.rfind(_EOCD64_LOCATOR, 0, at)
        if locator >= 0:  # zip64: the real counts and offsets are in the zip64 end record
            (eocd64_at,) = struct.unpack_from("<Q", tail, locator + 8)
            record = _get(self.url, eocd64_at, eocd64_at + 55)
            if record[:4] != _EOCD64:
                raise WheelError(f"{self.filename}: the zip64 end record is not where its locator says")
            entries, _, cd_size, cd_offset = struct.unpack_from("<QQQQ", record, 24)
        directory = _get(self.url, cd_offset, cd_offset + cd_size - 1)
        members: dict[str, Member] = {}
        pos = 0
        for _ in range(entries):
            if directory[pos : pos + 4] != _CENTRAL:
                raise WheelError(f"{self.filename}: damaged central directory at entry {len(members)}")
            method, _, _, _, csize, size, name_len, extra_len, comment_len = struct.unpack_from(
                "<HHHIIIHHH", directory, pos + 10
            )
            (offset,) = struct.unpack_from("<I", directory, pos + 42)
            name = directory[pos + 46 : pos + 46 + name_len].decode("utf-8")
            extra = directory[pos + 46 + name_len : pos + 46 + name_len + extra_len]
            size, csize, offset = _zip64_fields(extra, size, csize, offset)
            members[name] = Member(name, offset, csize, size, method)
            pos += 46 + name_len + extra_len + comment_len
        return members

    def read(self, name: str, limit_bytes: int = 1 << 20) -> bytes:
        """A small member's bytes (a text file, a build-info module), at most ``limit_bytes``."""
        member = self.members()[name]
        if member.size_bytes > limit_bytes:
            raise WheelError(f"{self.filename}: {name} is {member.size_bytes} bytes, more than {limit_bytes} asked for")
        with tempfile.TemporaryFile() as out:
            self._inflate_to(member, out)
            out.seek(0)
            return out.read()

    def open_member(self, name: str, folder: Path) -> BinaryIO:
        """A member inflated into a temporary file under ``folder`` (deleted when closed), at position 0."""
        folder.mkdir(parents=True, exist_ok=True)
        out = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115 - returned open; the caller closes it
        try:
            self._inflate_to(self.members()[name], out)
        except BaseException:
            out.close()
            raise
        out.seek(0)
        return out

    def _inflate_to(self, member: Member, out: BinaryIO) -> None:
        header = _get(self.url, member.offset, member.offset + 29)
        if header[:4] != _LOCAL:
            raise WheelError(f"{self.filename}: no local header for {member.name} at {member.offset}")
        name_len, extra_len = struct.unpack_from("<HH", header, 26)
        start = member.offset + 30 + name_len + extra_len
        if member.method not in (0, 8):
            raise WheelError(
                f"{self.filename}: {member.name} uses zip method {member.method} (only stored and deflate)"
            )
        inflate = zlib.decompressobj(-15) if member.method == 8 else None
        written = 0
        with _get(self.url, start, start + member.compressed_bytes - 1, stream=True) as response:
            while chunk := response.read(_CHUNK_BYTES):
                data = inflate.decompress(chunk) if inflate else chunk
                out.write(data)
                written += len(data)
        if inflate:
            tail = inflate.flush()
            out.write(tail)
            written += len(tail)
        if written != member.size_bytes:
            raise WheelError(f"{self.filename}: {member.name} inflated to {written} bytes, not {member.size_bytes}")

    def cached_json(self, key: str):
        """What was cached for this wheel under ``key`` (``None`` when nothing was)."""
        path = self.cache / f"{re.sub(r'[^A-Za-z0-9._+-]', '_', key)}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def cache_json(self, key: str, value) -> None:
        """Cache ``value`` (JSON-able) for this wheel under ``key``."""
        self.cache.mkdir(parents=True, exist_ok=True)
        write_json(self.cache / f"{re.sub(r'[^A-Za-z0-9._+-]', '_', key)}.json", value, compact=True, atomic=True)


def _zip64_fields(extra: bytes, size: int, csize: int, offset: int) -> tuple[int, int, int]:
    """Sizes and offset from a zip64 extra field, for those the 32-bit fields mark as 0xFFFFFFFF."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 0x0001:
            values = list(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
            if size == 0xFFFFFFFF and values:
                size = values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
        pos += 4 + length
    return size, csize, offset
