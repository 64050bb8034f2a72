"""Per-frame probabilities on disk, written as they come, never seen half-written.

**CSV** (``<name>_predictions.csv``), laid out as DeepEthogram's label files and gpufeed's own
(:mod:`gpufeed.pipelines._label_csv`): a header ``frame,<class>,...`` with the model's class names
in output order, then one row per frame, the frame index and each class's probability (9 significant
digits: a float32 read back is the float32 written). pandas reads it with ``index_col=0``, as
DeepEthogram reads its label files.

**HDF5** (``<name>_outputs.h5``), DeepEthogram's output file layout (``deepethogram.projects.
import_outputfile`` reads it): one group per model, named by its latent name (default: the
architecture, e.g. ``clip_resnet18``), holding ``P`` (frames, K) float32 probabilities, ``logits``
(frames, K) float32, ``thresholds`` (K,) float32 (0.5 each: gpufeed tunes none) and ``class_names``
(K,) strings. A file DeepEthogram already wrote keeps its other groups; a group of the same name is
replaced.

**Atomic, resumable.** Rows stream into a hidden temporary file beside the output (``.<name>.tmp-<pid>``,
:func:`gpufeed.core._files.atomic_path`), which is flushed, synced and renamed over the output only
once the last frame is written; a run killed mid-video leaves no output (and at most that hidden
file, which a later run removes once it has lain untouched for ten minutes with its writer gone),
so the output's presence means the video is done (:func:`is_done`), and a second run keeps it when
the manifest beside it says this model wrote it (:mod:`._manifest`). HDF5 datasets are written block by block into chunked datasets of the final size, so
memory stays a block's whatever the video's length.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.core import atomic_path, remove_stale_temps

__all__ = ["DEFAULT_THRESHOLD", "FrameSink", "csv_sink", "h5_sink", "holds_groups", "is_done", "read_predictions_csv"]

DEFAULT_THRESHOLD = 0.5
_CHUNK_ROWS = 4096


class FrameSink:
    """Where a video's frame blocks go: ``write(first_frame, probabilities, logits)`` in frame order."""

    def write(self, first_frame: int, probabilities: np.ndarray, logits: np.ndarray) -> None:
        raise NotImplementedError


class _CsvSink(FrameSink):
    def __init__(self, handle, classes: int) -> None:
        self.handle, self.next_frame = handle, 0
        self.fmt = ",".join(["%d"] + ["%.9g"] * classes)

    def write(self, first_frame: int, probabilities: np.ndarray, logits: np.ndarray) -> None:
        if first_frame != self.next_frame:
            raise ValueError(f"frame {first_frame} arrived; frame {self.next_frame} was expected next")
        index = np.arange(first_frame, first_frame + len(probabilities), dtype=np.float64)[:, None]
        np.savetxt(self.handle, np.hstack([index, probabilities.astype(np.float64)]), fmt=self.fmt, delimiter=",")
        self.next_frame += len(probabilities)


@contextmanager
def csv_sink(path: Path, labels: tuple[str, ...], num_frames: int) -> Iterator[FrameSink]:
    """A CSV of ``num_frames`` rows at ``path``, renamed into place when the block ends having written them all.

    Raises:
        ValueError: The block ended with rows missing (the output is not written).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)  # a killed run's partial rows
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(",".join(["frame", *(_cell(name) for name in labels)]) + "\n")
        sink = _CsvSink(handle, len(labels))
        yield sink
        if sink.next_frame != num_frames:
            raise ValueError(f"{sink.next_frame} of {num_frames} frames were scored; {path.name} is not written")
        handle.flush()


def _cell(name: str) -> str:
    """A class name as a CSV header cell (quoted when it holds a comma, quote or line break)."""
    if any(c in name for c in ',"\r\n'):
        return '"' + name.replace('"', '""') + '"'
    return name


class _H5Sink(FrameSink):
    def __init__(self, group, num_frames: int) -> None:
        self.group, self.num_frames, self.next_frame = group, num_frames, 0

    def write(self, first_frame: int, probabilities: np.ndarray, logits: np.ndarray) -> None:
        if first_frame != self.next_frame:
            raise ValueError(f"frame {first_frame} arrived; frame {self.next_frame} was expected next")
        end = first_frame + len(probabilities)
        self.group["P"][first_frame:end] = probabilities
        self.group["logits"][first_frame:end] = logits
        self.next_frame = end


@contextmanager
def h5_sink(
    path: Path, group_name: str, labels: tuple[str, ...], num_frames: int, attrs: dict[str, Any] | None = None
) -> Iterator[FrameSink]:
    """DeepEthogram's output group ``group_name`` in ``path`` (see the module docs), put in place at the end.

    Raises:
        ValueError: The block ended with frames missing (the output is not changed).
    """
    import h5py

    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)  # a killed run's partial copy
    with atomic_path(path) as tmp:
        if path.exists():  # DeepEthogram's own groups stay: the new file starts as a copy of the old
            shutil.copyfile(path, tmp)
        with h5py.File(tmp, "r+" if path.exists() else "w") as handle:
            if group_name in handle:
                del handle[group_name]
            group = handle.create_group(group_name)
            classes = len(labels)
            chunks = (max(1, min(_CHUNK_ROWS, num_frames)), classes)
            for name in ("P", "logits"):
                group.create_dataset(name, shape=(num_frames, classes), dtype=np.float32, chunks=chunks)
            group.create_dataset("thresholds", data=np.full(classes, DEFAULT_THRESHOLD, dtype=np.float32))
            group.create_dataset("class_names", data=list(labels), dtype=h5py.string_dtype())
            for key, value in (attrs or {}).items():
                group.attrs[key] = value
            sink = _H5Sink(group, num_frames)
            yield sink
            if sink.next_frame != num_frames:
                raise ValueError(f"{sink.next_frame} of {num_frames} frames were scored; {path.name} is not written")


def holds_groups(fmt: str) -> bool:
    """Whether one file of this output format holds named groups (HDF5), not one video's rows (CSV)."""
    return fmt != "csv"


def is_done(path: Path, fmt: str, group_name: str = "") -> bool:
    """Whether ``path`` holds a finished output (an output is renamed into place only when complete).

    A CSV: the file exists. HDF5: the file exists and holds the group (DeepEthogram's own output
    file without it is not done).
    """
    if not path.is_file():
        return False
    if not holds_groups(fmt):
        return True
    import h5py

    with contextlib.suppress(OSError), h5py.File(path, "r") as handle:
        return group_name in handle and "P" in handle[group_name]
    return False


def read_predictions_csv(path: str | Path) -> tuple[tuple[str, ...], np.ndarray]:
    """Read a ``<name>_predictions.csv`` back: (class names, (frames, K) float32). For tests and examples.

    Raises:
        ValueError: The rows are not frames 0, 1, ... in order.
    """
    import csv

    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle))
    names = tuple(rows[0][1:])
    index = np.array([int(r[0]) for r in rows[1:]], dtype=np.int64)
    if not np.array_equal(index, np.arange(len(index))):
        raise ValueError(f"{path}: frame column is not 0, 1, 2, ... in order")
    values = np.array([[float(v) for v in r[1:]] for r in rows[1:]], dtype=np.float32).reshape(len(index), len(names))
    return names, values
