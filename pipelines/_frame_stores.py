"""Frame stores: a video kept as a folder of numbered images, or as an HDF5 file of encoded frames.

DeepEthogram tells its users to store videos this way because every frame is a separate image, so
a clip anywhere costs only its own decodes, no seeking. The layouts are the ones its ``vidio``
package writes:

* **frame folder** (``vidio.DirectoryWriter``): ``000000000.png``, ``000000001.png``, ... (or
  ``.jpg``), frame ``i`` in file number ``i``; numbers must run from 0 without a gap, all with the
  same digits and extension, so the name of any frame is known without listing the folder again.
  Files hold ordinary RGB images.
* **HDF5** (``vidio.HDF5Writer``): a ``.h5``/``.hdf5`` file with a ``frame`` dataset of
  variable-length uint8 arrays, element ``i`` the encoded PNG/JPEG bytes of frame ``i``. vidio
  hands its RGB arrays to OpenCV's ``imencode``, which takes them for BGR, and reads them back with
  ``imdecode`` unconverted: the stored images hold the channels in reverse order, so gpufeed
  reverses the channels of HDF5 frames (:data:`HDF5_CHANNELS_REVERSED`) and gets the frames vidio wrote.

The label CSV of a store is ``<name>.csv`` beside it (``mouse1/`` -> ``mouse1.csv``, ``mouse1.h5``
-> ``mouse1.csv``). This module stays light (numpy, h5py, the image-facts walker): it reads bytes;
DALI's image decoder decodes them (see :mod:`gpufeed.pipelines._clip_pipeline`).
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufeed._object_path import ObjectPath, is_object_url
from gpufeed._storage import DataPath, data_path, file_size, join, listdir, media_source, read_bytes
from gpufeed.pipelines._frame_sizes import frame_size_problem
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS, read_image_facts
from gpufeed.pipelines._image_verify import decode_problem
from gpufeed.pipelines._shards import read_shard_frames

__all__ = [
    "FRAME_FOLDER_EXTENSIONS",
    "HDF5_CHANNELS_REVERSED",
    "HDF5_DATASET",
    "HDF5_EXTENSIONS",
    "FrameBytesReader",
    "StoreFacts",
    "decode_frame",
    "decode_store_frames",
    "describe_bad_frame",
    "is_frame_folder",
    "label_path",
    "probe_store",
    "store_kind",
]

FRAME_FOLDER_EXTENSIONS = (".png", ".jpg", ".jpeg")
HDF5_EXTENSIONS = (".h5", ".hdf5")
HDF5_DATASET = "frame"
# vidio encodes RGB arrays with OpenCV, which writes them as BGR (see the module docs).
HDF5_CHANNELS_REVERSED = True
_NUMBERED = re.compile(r"^(\d+)(\.[A-Za-z]+)$")


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


def store_kind(path: str | Path | ObjectPath) -> str:
    """``"folder"``, ``"hdf5"`` or ``""`` (an encoded video file, or nothing gpufeed reads)."""
    path = data_path(path)
    if path.suffix.lower() in HDF5_EXTENSIONS:
        return "hdf5"
    if path.is_dir():
        return "folder"
    return ""


def label_path(video: str | Path | ObjectPath) -> DataPath:
    """The label CSV of a video file or frame store: ``<name>.csv`` beside it."""
    video = data_path(video)
    if video.is_dir():  # a folder's name may hold dots ("mouse.day1"): keep all of it
        return video.with_name(video.name + ".csv")
    return video.with_suffix(".csv")


@dataclass(frozen=True)
class StoreFacts:
    """What probing a frame store learns (see :func:`probe_store`).

    Attributes:
        kind: ``"folder"`` or ``"hdf5"``.
        codec: ``"png"`` or ``"jpeg"``: the format of frame 0.
        width, height: Frame 0's size in pixels.
        num_frames: Frames in the store.
        frame_name: Folders: a ``str.format`` pattern of frame file names (``"{:09d}.png"``).
        problem: Why the store cannot be used, naming the frame; ``None`` when fine.
    """

    kind: str
    codec: str = ""
    width: int = 0
    height: int = 0
    num_frames: int = 0
    frame_name: str = ""
    problem: str | None = None


def _facts_of_first(kind: str, data_or_path, count: int, frame_name: str, what: str) -> StoreFacts:
    facts = read_image_facts(data_or_path)
    if facts.problem or facts.format not in ("PNG", "JPEG"):
        why = facts.problem or f"a {facts.format} image; frames must be PNG or JPEG"
        return StoreFacts(kind, num_frames=count, frame_name=frame_name, problem=f"{what} is not usable: {why}")
    return StoreFacts(kind, facts.format.lower(), facts.width, facts.height, count, frame_name)


def _probe_folder(path: DataPath) -> StoreFacts:
    numbered: dict[int, str] = {}
    try:
        names = sorted(listdir(path))
    except OSError as err:
        return StoreFacts("folder", problem=f"unreadable folder: {err.strerror or err}")
    extensions = set()
    for name in names:
        match = _NUMBERED.match(name)
        if match and match.group(2).lower() in FRAME_FOLDER_EXTENSIONS:
            number = int(match.group(1))
            if number in numbered:
                return StoreFacts("folder", problem=f"frames {numbered[number]} and {name} share number {number}")
            numbered[number] = name
            extensions.add(match.group(2))
    if not numbered:
        return StoreFacts("folder", problem="no numbered frames (000000000.png, 000000001.png, ...) in the folder")
    if len(extensions) > 1:
        return StoreFacts("folder", problem=f"frames mix extensions {sorted(extensions)}; use one")
    count = len(numbered)
    missing = sorted(set(range(count)) - set(numbered))
    if missing or max(numbered) != count - 1:
        first = missing[0] if missing else count
        last = max(numbered)
        return StoreFacts(
            "folder",
            num_frames=count,
            problem=f"missing frame number {first}: frames must be numbered 0..{count - 1} without a gap, "
            f"the folder holds {count} numbered frames up to {last}",
        )
    first_name = numbered[0]
    stem, ext = os.path.splitext(first_name)
    pattern = "{:0" + str(len(stem)) + "d}" + ext
    for number, name in numbered.items():
        if pattern.format(number) != name:
            return StoreFacts(
                "folder",
                num_frames=count,
                problem=f"frame {name} is not named like {first_name} ({pattern.format(number)} expected): "
                "every frame needs the same number of digits",
            )
        try:
            if file_size(path / name) == 0:
                return StoreFacts("folder", num_frames=count, problem=f"zero-byte frame {name} (frame {number})")
        except OSError as err:
            return StoreFacts("folder", num_frames=count, problem=f"frame {name} is unreadable: {err.strerror or err}")
    return _facts_of_first("folder", path / first_name, count, pattern, f"frame 0 ({first_name})")


def _open_frames(path: DataPath):
    """(h5py file, its ``frame`` dataset); raises ``ValueError`` naming what is wrong."""
    import h5py

    try:
        handle = h5py.File(media_source(path), "r")
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


def _probe_hdf5(path: DataPath) -> StoreFacts:
    try:
        if file_size(path) == 0:
            return StoreFacts("hdf5", problem="zero-byte file")
        handle, dataset = _open_frames(path)
    except (OSError, ValueError) as err:
        return StoreFacts("hdf5", problem=str(getattr(err, "strerror", None) or err))
    try:
        count = len(dataset)
        if count == 0:
            return StoreFacts("hdf5", problem=f"the '{HDF5_DATASET}' dataset holds no frames")
        return _facts_of_first("hdf5", dataset[0].tobytes(), count, "", "frame 0")
    finally:
        handle.close()


def probe_store(path: str | Path | ObjectPath) -> StoreFacts:
    """Learn a frame store's format, size and frame count (frame 0's header only; no decoding).

    Problems are described, not raised: a missing frame number, a zero-byte frame, frame names of
    different widths, an HDF5 file without a ``frame`` dataset, a frame 0 that is not PNG/JPEG.
    """
    path = data_path(path)
    return _probe_folder(path) if store_kind(path) == "folder" else _probe_hdf5(path)


def _file_bytes(path: str) -> np.ndarray:
    """A file's bytes as a writable uint8 array: half the time of ``np.fromfile`` on 50 kB frames (measured)."""
    if is_object_url(path):
        return np.frombuffer(bytearray(read_bytes(path)), dtype=np.uint8)
    with open(path, "rb", buffering=0) as file:
        data = bytearray(os.fstat(file.fileno()).st_size)
        got = file.readinto(data)
    return np.frombuffer(data, dtype=np.uint8)[:got]


class FrameBytesReader:
    """Read the encoded bytes of frames by index, keeping a few HDF5 files open.

    Args:
        max_open: HDF5 files kept open (least recently used closed first).
    """

    def __init__(self, max_open: int = 8) -> None:
        self.max_open = max_open
        self._open: OrderedDict[str, tuple] = OrderedDict()

    def read(self, path: str, kind: str, frame_name: str, frames) -> list[np.ndarray]:
        """The encoded bytes of ``frames`` of the store at ``path``, each a 1-D uint8 array.

        Raises:
            OSError, ValueError: The store or a frame cannot be read (the message names it).
        """
        if kind == "folder":
            return [_file_bytes(join(path, frame_name.format(int(i)))) for i in frames]
        if kind == "shard":  # a clip in a tar shard: its span, one ranged read (gpufeed.pipelines._shards)
            return read_shard_frames(path, frame_name, frames)
        hit = self._open.pop(path, None)
        if hit is None:
            hit = _open_frames(data_path(path))
            while len(self._open) >= self.max_open:
                self._open.popitem(last=False)[1][0].close()
        self._open[path] = hit
        dataset = hit[1]
        frames = np.asarray(frames, dtype=np.int64)
        if len(frames) > 1 and np.all(np.diff(frames) > 0):
            # One read of the clip's span: h5py costs far more per call than per element.
            span = dataset[int(frames[0]) : int(frames[-1]) + 1]
            if len(span) != frames[-1] - frames[0] + 1:
                raise IndexError(f"frames {frames[0]}..{frames[-1]} are outside the {len(dataset)} frames")
            return [np.asarray(span[int(i - frames[0])], dtype=np.uint8) for i in frames]
        return [np.asarray(dataset[int(i)], dtype=np.uint8) for i in frames]

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1][0].close()


def decode_frame(data: bytes, kind: str) -> np.ndarray:
    """One encoded frame of a ``kind`` store as (H, W, 3) uint8 RGB, with Pillow (HDF5 channels put back)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        rgb = np.asarray(image.convert("RGB"))
    return np.ascontiguousarray(rgb[..., ::-1]) if kind == "hdf5" and HDF5_CHANNELS_REVERSED else rgb


def describe_bad_frame(data: bytes, where: str, problem: str) -> str:
    """``"<where> is not an image: <problem>"`` (or ``is damaged``, for a PNG/JPEG that fails to decode, or
    ``is refused``, for one whose header declares too many pixels)."""
    what = "is not an image" if read_image_facts(data).format == "" else "is damaged"
    what = "is refused" if problem.startswith("too many pixels") else what
    return f"{where} {what}: {problem}"


def decode_store_frames(
    path: str,
    kind: str,
    frame_name: str,
    frames=None,
    *,
    pixels: bool = False,
    size: tuple[int, int] | None = None,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> tuple[int, str | None, list[np.ndarray]]:
    """Decode frames of a store outside DALI (``gpufeed check``, and naming a bad file after a failure).

    Args:
        frames: Frame indices (default: every frame).
        pixels: Also return the decoded RGB frames (as vidio's readers give them).
        size: (width, height) every frame must have (default: frame 0's): a frame of another size,
            judged from its header, is a problem (:func:`~gpufeed.pipelines._frame_sizes.frame_size_problem`).
        max_pixels: A frame whose header declares more is a problem, never decoded.

    Returns:
        (frames decoded, the first problem naming its frame or ``None``, the RGB frames if asked).
    """
    reader = FrameBytesReader(max_open=1)
    out: list[np.ndarray] = []
    try:
        if frames is None or size is None:
            probed = probe_store(path)
            frames = range(probed.num_frames) if frames is None else frames
            size = size or (probed.width, probed.height)
        count = 0
        for index in frames:
            where = frame_name.format(int(index)) if kind == "folder" else f"frame {int(index)}"
            try:
                (data,) = reader.read(path, kind, frame_name, [index])
            except (OSError, ValueError, IndexError) as err:
                return count, f"{where} cannot be read: {err}", out
            # The pixel limit first (from the header, nothing decoded): a bomb is named as one, not
            # as a frame of another size.
            problem = decode_problem(data.tobytes(), max_pixels=max_pixels)
            if problem:
                return count, describe_bad_frame(data.tobytes(), where, problem), out
            problem = frame_size_problem(data.tobytes(), where, *size)
            if problem:
                return count, problem, out
            if pixels:
                out.append(decode_frame(data.tobytes(), kind))
            count += 1
        return count, None, out
    finally:
        reader.close()
