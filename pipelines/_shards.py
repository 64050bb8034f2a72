"""WebDataset-style tar shards: the layout ``gpufeed prepare --shards`` writes, and how the loaders read it.

A shard folder (local, or ``s3://bucket/prefix``) holds::

    shards.json            the manifest: what kind of samples, their classes or behaviours, every
                           shard, and one row per sample (its byte range, label(s), size, source)
    shard-000000.tar       a POSIX (ustar) tar: each sample's files, one after another, named
    shard-000000.idx       <key>.<ext>; DALI's webdataset index of the tar (format v1.2), so
    shard-000001.tar ...   DALI's fn.readers.webdataset reads the shards without scanning them

**Image samples**: ``<key>.jpg`` (or ``.png``: the source file's bytes, unchanged) and ``<key>.cls``
(the class index as decimal text, WebDataset's convention). **Clip samples**: one per clip of a
source video (its evaluation clips, :meth:`~gpufeed.pipelines._clips.ClipGeometry.eval_starts`):
``<key>.f0000.jpg`` ... (frame ``t`` of the clip as a JPEG, or ``.png``), ``<key>.labels.npy``
(uint8 (T, K) multi-hot labels of its frames) and ``<key>.json`` (source video, first frame,
stride, behaviours). Keys are the sample's id as eight digits, so names sort in sample order.

**Sample ids** are positions in the manifest's rows: shard after shard, the tar's order within
one. They never depend on the reader, the world size or the order a loader reads in, so every
loader's epoch plan, its exact resume and its one-rank-per-sample shares (:mod:`gpufeed.pipelines._sampler`,
:mod:`gpufeed.pipelines._shares`) hold for shards as for files.

**Reading.** A sample's row gives its byte range, so a loader reads any sample in any order with
one ranged read (:func:`gpufeed.core._storage.read_range`: ``pread`` of a local tar, a ranged GET of an
object): an image member, or a clip's whole span (its frames and labels together), whose tar
headers :func:`tar_members` walks. Samples are named, in messages and quarantine lists, by
:func:`gpufeed.core._storage.member_ref` (``shard-000003.tar#<offset>:<size>:<key>``).

DALI's ``fn.readers.webdataset`` reads the same shards (local or ``s3://``; its index files
must be local), in its own order: the shards in the order given, each tar front to back, split into
``num_shards`` contiguous parts, shuffled through a buffer of ``initial_fill`` samples. That order
cannot follow a plan drawn from ``(seed, epoch)``, nor resume on another number of ranks, so the
loaders read by ranges instead; the ``.idx`` files are written for DALI's reader and other
WebDataset tools.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufeed.core import DataPath, ObjectPath, data_path, is_remote, member_ref, quoted, read_bytes, split_member
from gpufeed.pipelines._errors import DatasetError

__all__ = [
    "MANIFEST_NAME",
    "SHARD_FORMAT",
    "ShardBytes",
    "ShardManifest",
    "is_shard_dir",
    "read_manifest",
    "read_shard_frames",
    "tar_members",
]

MANIFEST_NAME = "shards.json"
SHARD_FORMAT = "gpufeed-shards"
SHARD_VERSION = 1
# A manifest holds one row per sample; this bounds what a malformed or hostile one may cost to read.
_MANIFEST_MAX_BYTES = 1 << 30
_BLOCK = 512
IMAGE_COLUMNS = ("key", "shard", "offset", "size", "ext", "label", "width", "height", "orientation", "source")
CLIP_COLUMNS = ("key", "shard", "offset", "size", "frames", "width", "height", "labels", "source", "start", "ext")


@dataclass(frozen=True)
class ShardManifest:
    """A shard folder's ``shards.json``, read (see the module docs).

    Attributes:
        root: The shard folder.
        kind: ``"images"`` or ``"clips"``.
        names: The class names (images) or behaviour names (clips), in label order.
        shards: The tar files' names, in sample order.
        rows: One dict per sample (the kind's columns), in sample-id order.
        clip_length_frames, stride_frames: The clips' length and the stride of their stored frames.
    """

    root: DataPath
    kind: str
    names: tuple[str, ...]
    shards: tuple[str, ...]
    rows: tuple[dict, ...]
    clip_length_frames: int = 0
    stride_frames: int = 1

    def ref(self, sample_id: int) -> str:
        """The sample's byte range in its shard, as :func:`gpufeed.core._storage.member_ref` text."""
        row = self.rows[sample_id]
        name = f"{row['key']}.{row['ext']}" if self.kind == "images" else str(row["key"])
        return member_ref(self.root / self.shards[row["shard"]], row["offset"], row["size"], name)


def is_shard_dir(path: object) -> bool:
    """Whether ``path`` is a shard folder (it holds ``shards.json``)."""
    try:
        root = data_path(path)  # type: ignore[arg-type]  # any path-like text; others are not shard folders
        return (root / MANIFEST_NAME).is_file()
    except (OSError, TypeError, ValueError):
        return False


def read_manifest(root: str | Path | ObjectPath, kind: str | None = None) -> ShardManifest:
    """Read and check a shard folder's manifest.

    Args:
        kind: ``"images"`` or ``"clips"`` when the caller reads only one kind.

    Raises:
        DatasetError: No manifest, not gpufeed's format or version, another kind, or a row that
            names a shard or column the manifest does not have (the message names which).
    """
    root = data_path(root)
    where = root / MANIFEST_NAME
    try:
        document = json.loads(read_bytes(where, max_bytes=_MANIFEST_MAX_BYTES))
    except OSError as err:
        raise DatasetError(f"shard manifest {where} cannot be read: {err.strerror or err}") from None
    except ValueError as err:
        raise DatasetError(f"shard manifest {where} is not JSON: {err}") from None
    if not isinstance(document, dict) or document.get("format") != SHARD_FORMAT:
        raise DatasetError(f"{where} is not a gpufeed shard manifest ('format': {SHARD_FORMAT!r} expected)")
    if document.get("version") != SHARD_VERSION:
        raise DatasetError(
            f"{where}: version {quoted(document.get('version'))} is not read here; expected {SHARD_VERSION}"
        )
    found = document.get("kind")
    if found not in ("images", "clips") or (kind is not None and found != kind):
        want = kind or "images or clips"
        raise DatasetError(f"{where} holds {quoted(found)} samples; expected {want}")
    columns = IMAGE_COLUMNS if found == "images" else CLIP_COLUMNS
    shards = tuple(str(s["name"]) for s in document.get("shards", ()))
    rows = []
    for number, values in enumerate(document.get("rows", ())):
        if not isinstance(values, list) or len(values) != len(columns):
            raise DatasetError(f"{where}: row {number} is not {len(columns)} values ({', '.join(columns)})")
        row = dict(zip(columns, values, strict=True))
        if not isinstance(row["shard"], int) or not 0 <= row["shard"] < len(shards):
            raise DatasetError(f"{where}: row {number} names shard {quoted(row['shard'])} of {len(shards)}")
        rows.append(row)
    if not rows:
        raise DatasetError(f"{where} lists no samples")
    return ShardManifest(
        root,
        found,
        tuple(str(n) for n in document.get("names", ())),
        shards,
        tuple(rows),
        int(document.get("clip_length_frames", 0)),
        int(document.get("stride_frames", 1)),
    )


def tar_members(span: bytes, where: str) -> dict[str, bytes]:
    """The regular files in ``span`` (whole ustar members, from a header on): name -> bytes.

    Raises:
        ValueError: A header's size is not octal, or a member runs past the span (named with ``where``).
    """
    members: dict[str, bytes] = {}
    view = memoryview(span)
    pos = 0
    while pos + _BLOCK <= len(span):
        header = bytes(view[pos : pos + _BLOCK])
        if header == bytes(_BLOCK):
            break  # the end-of-archive blocks
        name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
        prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace")
        try:
            size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            raise ValueError(f"{where}: the tar header at byte {pos} has no size") from None
        start = pos + _BLOCK
        if start + size > len(span):
            raise ValueError(f"{where}: member {quoted(name)} runs {start + size - len(span)} bytes past the span")
        if header[156:157] in (b"0", b"\0"):
            members[f"{prefix}/{name}" if prefix else name] = bytes(view[start : start + size])
        pos = start + -(-size // _BLOCK) * _BLOCK
    return members


def read_shard_frames(ref: str, frame_name: str, frames) -> list[np.ndarray]:
    """Frames ``frames`` of a clip stored in a shard, each its encoded bytes (1-D uint8): one ranged read.

    Args:
        ref: The clip's span (:func:`gpufeed.core._storage.member_ref`).
        frame_name: A ``str.format`` pattern of its frame members (``"00000012.f{:04d}.jpg"``).

    Raises:
        OSError, ValueError, IndexError: The span cannot be read, or lacks a frame (the message names it).
    """
    members = tar_members(read_bytes(ref), ref)
    out = []
    for index in frames:
        name = frame_name.format(int(index))
        data = members.get(name)
        if data is None:
            raise IndexError(f"{ref}: no member {name} in the clip's span")
        out.append(np.frombuffer(bytearray(data), dtype=np.uint8))
    return out


class ShardBytes:
    """Encoded bytes of samples by id, each one ranged read, a batch's reads in parallel from object storage.

    Args:
        refs: Every sample's :func:`gpufeed.core._storage.member_ref`.
        threads: Reads in flight at once for shards in object storage (latency-bound); local
            shards are read in the calling thread (``pread`` of a page-cached file).
    """

    def __init__(self, refs: list[str], threads: int = 16) -> None:
        self.refs = refs
        first = split_member(refs[0]) if refs else None
        remote = first is not None and is_remote(first[0])
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gpufeed-shard") if remote else None

    def read(self, ids: np.ndarray) -> list[np.ndarray]:
        """The encoded bytes of samples ``ids``, in order, as 1-D uint8 arrays.

        Raises:
            OSError: A shard cannot be read (the message names the member).
        """
        refs = [self.refs[int(i)] for i in ids]
        chunks = list(self._pool.map(read_bytes, refs)) if self._pool is not None else [read_bytes(r) for r in refs]
        return [np.frombuffer(chunk, dtype=np.uint8) for chunk in chunks]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
