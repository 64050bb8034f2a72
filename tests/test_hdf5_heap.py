"""HDF5 frames read straight from the file give exactly h5py's bytes, and every other layout goes to h5py.

Layouts: contiguous and chunked (clips across a chunk's end), frames of tens of kB (a heap
collection each) and small ones (sharing collections), strided and reversed frame lists; gzip'd
references, an empty element and out-of-range frames are left to h5py.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from gpufeed.pipelines._hdf5_heap import HeapFrames
from gpufeed.pipelines._store_kinds import frame_store

pytestmark = pytest.mark.unit


def _frames(count: int, rng: np.random.Generator) -> list[np.ndarray]:
    # Sizes from a few bytes (several a collection) to 70 kB (one collection each, larger than 64 kB).
    sizes = rng.choice([3, 40, 900, 5000, 51_000, 70_000], size=count)
    return [rng.integers(0, 256, size=int(n), dtype=np.uint8) for n in sizes]


def _write(path, frames, **dataset_args) -> None:
    with h5py.File(path, "w") as fh:
        data = fh.create_dataset("frame", (len(frames),), dtype=h5py.vlen_dtype(np.uint8), **dataset_args)
        for i, frame in enumerate(frames):
            data[i] = frame


def _read_direct(path, frames):
    with h5py.File(path, "r") as fh:
        heap = HeapFrames.of(fh["frame"])
        try:
            return None if heap is None else heap.read(frames)
        finally:
            if heap is not None:
                heap.close()


@pytest.mark.parametrize("layout", ["contiguous", "chunked", "appended"])
def test_direct_reads_are_h5pys_bytes(tmp_path, layout):
    rng = np.random.default_rng(3)
    frames = _frames(150, rng)
    path = tmp_path / "v.h5"
    if layout == "appended":  # vidio's and `prepare --store`'s way: resized for every frame
        with h5py.File(path, "w") as fh:
            data = fh.create_dataset("frame", (0,), maxshape=(None,), dtype=h5py.vlen_dtype(np.uint8), chunks=(16,))
            for i, frame in enumerate(frames):
                data.resize(i + 1, axis=0)
                data[i] = frame
    else:
        _write(path, frames, **({"chunks": (16,)} if layout == "chunked" else {}))
    wanted = [np.arange(10, 21), np.arange(0, 150, 7), np.array([140, 3, 77, 77]), np.arange(149, 150)]
    wanted += [np.arange(s, s + 11) for s in rng.integers(0, 139, size=20)]
    for picks in wanted:
        got = _read_direct(path, picks)
        assert got is not None, f"{layout}: frames {picks} went to h5py"
        assert len(got) == len(picks)
        for frame, data in zip(picks, got, strict=True):
            assert data.dtype == np.uint8 and data.flags.writeable
            np.testing.assert_array_equal(data, frames[int(frame)])


def test_other_layouts_and_frames_go_to_h5py(tmp_path):
    rng = np.random.default_rng(4)
    frames = _frames(40, rng)
    _write(tmp_path / "gzip.h5", frames, chunks=(8,), compression="gzip")
    assert _read_direct(tmp_path / "gzip.h5", np.arange(5)) is None
    frames[6] = np.zeros(0, dtype=np.uint8)
    _write(tmp_path / "plain.h5", frames)
    assert _read_direct(tmp_path / "plain.h5", np.arange(5)) is not None
    assert _read_direct(tmp_path / "plain.h5", np.arange(4, 9)) is None  # the empty element
    assert _read_direct(tmp_path / "plain.h5", np.arange(35, 41)) is None  # past the end


def test_a_reference_that_does_not_match_its_object_goes_to_h5py(tmp_path):
    frames = [np.full(50_000, i, dtype=np.uint8) for i in range(6)]
    path = tmp_path / "v.h5"
    _write(path, frames)
    with h5py.File(path, "r") as fh:
        refs = fh["frame"].id.get_offset()
    with open(path, "r+b") as raw:  # frame 2's length one byte short of its heap object's
        raw.seek(refs + 2 * 16)
        raw.write((49_999).to_bytes(4, "little"))
    assert _read_direct(path, np.arange(2)) is not None
    assert _read_direct(path, np.arange(3)) is None


def test_the_store_reader_reads_the_same_frames_either_way(tmp_path):
    rng = np.random.default_rng(5)
    frames = _frames(60, rng)
    _write(tmp_path / "plain.h5", frames)
    _write(tmp_path / "gzip.h5", frames, chunks=(8,), compression="gzip")
    reader = frame_store("hdf5").open_reader(1)  # one file open at a time: every read reopens the other
    try:
        for start in (0, 17, 49):
            picks = np.arange(start, start + 11)
            for name in ("plain.h5", "gzip.h5"):
                got = reader.read(str(tmp_path / name), "", picks)
                for frame, data in zip(picks, got, strict=True):
                    np.testing.assert_array_equal(data, frames[int(frame)])
    finally:
        reader.close()
