"""Frame store kinds: one :class:`FrameStore` class per way of keeping a video as separately encoded frames.

DeepEthogram tells its users to store videos this way because every frame is a separate image, so
a clip anywhere costs only its own decodes, no seeking. The two kinds registered here are the
layouts its ``vidio`` package writes:

* **frame folder** (:class:`FolderStore`, ``vidio.DirectoryWriter``): ``000000000.png``,
  ``000000001.png``, ... (or ``.jpg``), frame ``i`` in file number ``i``; numbers must run from 0
  without a gap, all with the same digits and extension, so the name of any frame is known without
  listing the folder again. Files hold ordinary RGB images.
* **HDF5** (:class:`Hdf5Store`, ``vidio.HDF5Writer``): a ``.h5``/``.hdf5`` file with a ``frame``
  dataset of variable-length uint8 arrays, element ``i`` the encoded PNG/JPEG bytes of frame ``i``.
  vidio hands its RGB arrays to OpenCV's ``imencode``, which takes them for BGR, and reads them
  back with ``imdecode`` unconverted: the stored images hold the channels in reverse order, so
  gpufeed reverses the channels of HDF5 frames (:data:`HDF5_CHANNELS_REVERSED`) and gets the
  frames vidio wrote.

A third kind is gpufeed's own: **a clip in a tar shard** (:class:`ShardStore`, ``gpufeed prepare
--shards``, :mod:`gpufeed.pipelines._shards`): its frames ``<key>.f0000.jpg`` ... are members of the
clip's span in a shard, read in one ranged read. The index takes such clips from the shard folder's
manifest (:meth:`~gpufeed.pipelines.VideoDataset.from_shards`), never by listing folders.

Every kind reads from a local path or from object storage (``s3://``: a folder is a prefix, a
file is read by ranges; :mod:`gpufeed.core._storage`).

The index records a kind's :attr:`FrameStore.kind` (``VideoInfo.store``); the feeds, the PyAV
decoder, ``check`` and ``prepare`` ask :func:`frame_store` for the kind and its answers, never
compare the name. A new storage is one subclass registered with :func:`register_store`, as the
three above are at the end of this module; the base class and the registry are in
:mod:`gpufeed.pipelines._store_base`, re-exported here. Reading any kind: :mod:`gpufeed.pipelines._frame_stores`.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from gpufeed.core import (
    DataPath,
    ObjectPath,
    data_path,
    file_size,
    is_object_url,
    is_outage,
    join,
    listdir,
    media_source,
    read_bytes,
    split_member,
)
from gpufeed.pipelines._containment import Roots, folder_link_problem, hdf5_link_problem
from gpufeed.pipelines._hdf5_heap import HeapFrames
from gpufeed.pipelines._shards import MANIFEST_NAME, read_shard_frames, tar_members

# The registry itself too: tests add a kind to it for their run (monkeypatch.setitem).
from gpufeed.pipelines._store_base import _STORES as _STORES
from gpufeed.pipelines._store_base import (
    FrameStore,
    StoreFacts,
    StoreReader,
    _facts_of_first,
    frame_store,
    register_store,
    store_extensions,
    store_kind,
    store_kinds,
)

__all__ = [
    "FRAME_FOLDER_EXTENSIONS",
    "HDF5_CHANNELS_REVERSED",
    "HDF5_DATASET",
    "HDF5_EXTENSIONS",
    "FolderStore",
    "FrameStore",
    "Hdf5Store",
    "ShardStore",
    "StoreFacts",
    "StoreReader",
    "frame_store",
    "is_frame_folder",
    "register_store",
    "store_extensions",
    "store_kind",
    "store_kinds",
]

FRAME_FOLDER_EXTENSIONS = (".png", ".jpg", ".jpeg")
HDF5_EXTENSIONS = (".h5", ".hdf5")
HDF5_DATASET = "frame"
# vidio encodes RGB arrays with OpenCV, which writes them as BGR (see the module docs).
HDF5_CHANNELS_REVERSED = True
_NUMBERED = re.compile(r"^(\d+)(\.[A-Za-z]+)$")
_CLIP_FRAME = re.compile(r"^(?P<key>[^/]+)\.f(?P<index>\d{4})\.(?P<ext>jpg|png)$")


def is_frame_folder(path: str | Path | ObjectPath) -> bool:
    """True for a folder whose files include numbered images (``000000000.png`` ...)."""
    try:
        for name in listdir(path):  # s3: one level of the prefix
            match = _NUMBERED.match(name)
            if match and match.group(2).lower() in FRAME_FOLDER_EXTENSIONS:
                return True
    except OSError:
        return False
    return False


def _file_bytes(path: str) -> np.ndarray:
    """A file's bytes as a writable uint8 array: half the time of ``np.fromfile`` on 50 kB frames (measured)."""
    if is_object_url(path):
        return np.frombuffer(bytearray(read_bytes(path)), dtype=np.uint8)
    with open(path, "rb", buffering=0) as file:
        data = bytearray(os.fstat(file.fileno()).st_size)
        got = file.readinto(data)
    return np.frombuffer(data, dtype=np.uint8)[:got]


def _local_file_bytes(path: str) -> np.ndarray:
    """:func:`_file_bytes` of a local file in three system calls (0.25 ms for 11 frames of 51 kB, 0.35-0.5 with ``open()``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = bytearray(os.fstat(fd).st_size)
        got = os.readv(fd, [data])
    finally:
        os.close(fd)
    return np.frombuffer(data, dtype=np.uint8)[:got]


class _FolderReader:
    def read(self, path: str, frame_name: str, frames) -> list[np.ndarray]:
        if is_object_url(path):
            return [_file_bytes(join(path, frame_name.format(int(i)))) for i in frames]
        return [_local_file_bytes(os.path.join(path, frame_name.format(int(i)))) for i in frames]

    def close(self) -> None:  # nothing stays open
        pass


class FolderStore(FrameStore):
    """A folder of numbered images, frame ``i`` in file number ``i`` (vidio's ``DirectoryWriter``)."""

    kind = "folder"
    described = "frame folders"

    def holds(self, path: DataPath) -> bool:
        return path.is_dir()

    def probe(self, path: DataPath) -> StoreFacts:
        try:
            names = sorted(listdir(path))
        except OSError as err:
            return StoreFacts(self.kind, problem=f"unreadable folder: {err.strerror or err}")
        numbered: dict[int, str] = {}
        extensions = set()
        for name in names:
            match = _NUMBERED.match(name)
            if match and match.group(2).lower() in FRAME_FOLDER_EXTENSIONS:
                number = int(match.group(1))
                if number in numbered:
                    return StoreFacts(self.kind, problem=f"frames {numbered[number]} and {name} share number {number}")
                numbered[number] = name
                extensions.add(match.group(2))
        if not numbered:
            return StoreFacts(self.kind, problem="no numbered frames (000000000.png, 000000001.png, ...) in the folder")
        if len(extensions) > 1:
            return StoreFacts(self.kind, problem=f"frames mix extensions {sorted(extensions)}; use one")
        count = len(numbered)
        missing = sorted(set(range(count)) - set(numbered))
        if min(numbered) == 1 and max(numbered) == count:  # ffmpeg's %06d.jpg numbers from 1
            return StoreFacts(
                self.kind,
                num_frames=count,
                problem=f"frames are numbered 1..{count}, as ffmpeg numbers them by default, but frame 0 is file "
                "number 0: extract with ffmpeg -i VIDEO -start_number 0 FOLDER/%06d.jpg (or rename each file to "
                "its number minus 1)",
            )
        if missing or max(numbered) != count - 1:
            first = missing[0] if missing else count
            return StoreFacts(
                self.kind,
                num_frames=count,
                problem=f"missing frame number {first}: frames must be numbered 0..{count - 1} without a gap, "
                f"the folder holds {count} numbered frames up to {max(numbered)}",
            )
        return self._check_names(path, numbered)

    def _check_names(self, path: DataPath, numbered: dict[int, str]) -> StoreFacts:
        count, first_name = len(numbered), numbered[0]
        stem, ext = os.path.splitext(first_name)
        pattern = "{:0" + str(len(stem)) + "d}" + ext
        for number, name in numbered.items():
            if pattern.format(number) != name:
                return StoreFacts(
                    self.kind,
                    num_frames=count,
                    problem=f"frame {name} is not named like {first_name} ({pattern.format(number)} expected): "
                    "every frame needs the same number of digits",
                )
            try:
                if file_size(path / name) == 0:
                    return StoreFacts(self.kind, num_frames=count, problem=f"zero-byte frame {name} (frame {number})")
            except OSError as err:
                if is_outage(err):  # the store or the machine, not the frame: never recorded as a bad file
                    raise
                why = f"frame {name} is unreadable: {err.strerror or err}"
                return StoreFacts(self.kind, num_frames=count, problem=why)
        return _facts_of_first(self.kind, path / first_name, count, pattern, f"frame 0 ({first_name})")

    def open_reader(self, max_open: int) -> _FolderReader:
        return _FolderReader()

    def frame_label(self, frame_name: str, index: int) -> str:
        return frame_name.format(int(index))

    def label_path(self, path: DataPath) -> DataPath:
        return path.with_name(path.name + ".csv")  # a folder's name may hold dots ("mouse.day1"): keep all of it

    def link_problem(self, path: DataPath, roots: Roots) -> str | None:
        return folder_link_problem(path, roots)

    def write(self, dst: Path, encoded: Iterable[bytes], ext: str) -> int:
        dst.mkdir(parents=True)
        count = 0
        for data in encoded:
            (dst / f"{count:09d}{ext}").write_bytes(data)
            count += 1
        return count


def _open_frames(path: DataPath):
    """(h5py file, its ``frame`` dataset); raises ``ValueError`` naming what is wrong."""
    import h5py

    try:
        handle = h5py.File(media_source(path), "r")  # s3://: a ranged-read file
    except OSError as err:
        raise ValueError(f"cannot be read as HDF5: {err}") from None
    dataset = handle.get(HDF5_DATASET)
    kind = h5py.check_vlen_dtype(dataset.dtype) if isinstance(dataset, h5py.Dataset) else None
    if dataset is None or kind is None or np.dtype(kind) != np.uint8 or dataset.ndim != 1:
        found = sorted(handle.keys())
        handle.close()
        raise ValueError(
            f"no '{HDF5_DATASET}' dataset of variable-length uint8 arrays (one encoded frame each, as vidio's "
            f"HDF5Writer writes); the file holds {found}"
        )
    return handle, dataset


class _Hdf5Reader:
    """Keeps a few HDF5 files open (least recently used closed first)."""

    def __init__(self, max_open: int) -> None:
        self.max_open = max_open
        self._open: OrderedDict[str, tuple] = OrderedDict()

    def read(self, path: str, frame_name: str, frames) -> list[np.ndarray]:
        hit = self._open.pop(path, None)
        if hit is None:
            handle, dataset = _open_frames(data_path(path))
            hit = (handle, dataset, HeapFrames.of(dataset))  # the frames straight from the file, where it can
            while len(self._open) >= self.max_open:
                _close_hdf5(self._open.popitem(last=False)[1])
        self._open[path] = hit
        dataset = hit[1]
        frames = np.asarray(frames, dtype=np.int64)
        direct = hit[2].read(frames) if hit[2] is not None else None
        if direct is not None:
            return direct
        if len(frames) > 1 and np.all(np.diff(frames) > 0):
            # One read of the clip's span: h5py costs far more per call than per element.
            span = dataset[int(frames[0]) : int(frames[-1]) + 1]
            if len(span) != frames[-1] - frames[0] + 1:
                raise IndexError(f"frames {frames[0]}..{frames[-1]} are outside the {len(dataset)} frames")
            return [np.asarray(span[int(i - frames[0])], dtype=np.uint8) for i in frames]
        return [np.asarray(dataset[int(i)], dtype=np.uint8) for i in frames]

    def close(self) -> None:
        while self._open:
            _close_hdf5(self._open.popitem()[1])


def _close_hdf5(hit: tuple) -> None:
    if hit[2] is not None:
        hit[2].close()
    hit[0].close()


class Hdf5Store(FrameStore):
    """An HDF5 file whose ``frame`` dataset holds one encoded image per element (vidio's ``HDF5Writer``)."""

    kind = "hdf5"
    described = "HDF5 files"
    extensions = HDF5_EXTENSIONS
    channels_reversed = HDF5_CHANNELS_REVERSED

    def probe(self, path: DataPath) -> StoreFacts:
        try:
            if file_size(path) == 0:
                return StoreFacts(self.kind, problem="zero-byte file")
            handle, dataset = _open_frames(path)
        except (OSError, ValueError) as err:
            return StoreFacts(self.kind, problem=str(getattr(err, "strerror", None) or err))
        try:
            count = len(dataset)
            if count == 0:
                return StoreFacts(self.kind, problem=f"the '{HDF5_DATASET}' dataset holds no frames")
            return _facts_of_first(self.kind, dataset[0].tobytes(), count, "", "frame 0")
        finally:
            handle.close()

    def open_reader(self, max_open: int) -> _Hdf5Reader:
        return _Hdf5Reader(max_open)

    def link_problem(self, path: DataPath, roots: Roots) -> str | None:
        return hdf5_link_problem(path, roots, HDF5_DATASET)

    def write(self, dst: Path, encoded: Iterable[bytes], ext: str) -> int:
        import h5py

        count = 0
        with h5py.File(dst, "w") as fh:
            data = fh.create_dataset(HDF5_DATASET, (0,), maxshape=(None,), dtype=h5py.vlen_dtype(np.uint8))
            for frame in encoded:
                data.resize(count + 1, axis=0)
                data[count] = np.frombuffer(frame, dtype=np.uint8)
                count += 1
        return count


class _ShardReader:
    def read(self, path: str, frame_name: str, frames) -> list[np.ndarray]:
        return read_shard_frames(path, frame_name, frames)  # the clip's span: one ranged read

    def close(self) -> None:  # nothing stays open
        pass


class ShardStore(FrameStore):
    """A clip in a tar shard (``gpufeed prepare --shards``): frames ``<key>.f0000.jpg`` ... in the clip's span.

    A store's path is the span (:func:`gpufeed.core._storage.member_ref` text: ``<tar>#<offset>:<size>:<key>``);
    its labels are the shard folder's manifest's.
    """

    kind = "shard"
    described = "clips in tar shards"
    per_video = False

    def holds(self, path: DataPath) -> bool:
        return split_member(str(path)) is not None

    def probe(self, path: DataPath) -> StoreFacts:
        ref = str(path)
        member = split_member(ref)
        if member is None:
            return StoreFacts(self.kind, problem="not a clip's span in a shard (<tar>#<offset>:<size>:<key>)")
        try:
            members = tar_members(read_bytes(ref), ref)
        except (OSError, ValueError) as err:
            return StoreFacts(
                self.kind, problem=f"the clip's span cannot be read: {getattr(err, 'strerror', None) or err}"
            )
        frames: dict[int, str] = {}
        for name in members:
            match = _CLIP_FRAME.match(name)
            if match and match["key"] == member[3]:
                frames[int(match["index"])] = name
        count = len(frames)
        if not frames or sorted(frames) != list(range(count)):
            return StoreFacts(
                self.kind, num_frames=count, problem=f"the span's frames are not {member[3]}.f0000 ... without a gap"
            )
        extensions = {name.rsplit(".", 1)[1] for name in frames.values()}
        if len(extensions) > 1:
            return StoreFacts(self.kind, num_frames=count, problem=f"frames mix extensions {sorted(extensions)}")
        pattern = f"{member[3]}.f{{:04d}}.{extensions.pop()}"
        return _facts_of_first(self.kind, members[frames[0]], count, pattern, f"frame 0 ({frames[0]})")

    def open_reader(self, max_open: int) -> _ShardReader:
        return _ShardReader()

    def label_path(self, path: DataPath) -> DataPath:
        member = split_member(str(path))
        return data_path(member[0]).with_name(MANIFEST_NAME) if member else path  # labels: the manifest's rows


# The storage kinds, registered in one place.
register_store(FolderStore())
register_store(Hdf5Store())
register_store(ShardStore())
