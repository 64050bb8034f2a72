"""An HDF5 store's frames read straight from the file: the vlen references, then the global heap objects.

h5py reads a variable-length element through HDF5's type conversion and its global heap cache:
an 11-frame clip of 51 kB JPEG frames at random places cost 0.4-1.6 ms of CPU (measured on the
benchmark's stores, 2-core CPU, load 1-4.7) and 0.1 ms only when its frames had just been read. The
bytes are simple on disk (the HDF5 file format specification): each element of a ``vlen`` uint8
dataset is 16 bytes, ``(length: u32, collection address: u64, object index: u32)``, little-endian,
and the object is a record ``(index: u16, references: u16, reserved: u32, size: u64)`` followed by
its bytes inside a global heap collection (``"GCOL"``, version 1, its size at byte 8, objects from
byte 16). vidio's writer and h5py give each frame of tens of kB a collection of its own, the object
first; small frames share collections. :class:`HeapFrames` reads the references with one
``pread`` per chunk a clip spans and each frame with one more (the same clip: 0.2 ms).

Only the plain layout is read this way: a local file (h5py's ``sec2`` driver) without a user
block, 8-byte addresses and lengths, a contiguous or chunked dataset without filters or external
storage, every chunk the clip touches stored whole. Anything else (and any reference that does
not match what it points at) returns ``None``, and the caller reads with h5py as before, errors
included. A frame is never read past the file's end, so memory stays bounded by the file's size as
with h5py.
"""

from __future__ import annotations

import os
import struct

import numpy as np

__all__ = ["HeapFrames"]

_REF = struct.Struct("<IQI")  # an element: sequence length, collection address, object index
_OBJECT = struct.Struct("<HHIQ")  # a heap object: index, references, reserved, size
_REF_BYTES = _REF.size  # 16
_HEAD_BYTES = 16  # a collection's header: "GCOL", version, 3 reserved, size (u64)
# A collection larger than this is not walked here (h5py reads its objects): HDF5 makes them 4 kB, or
# as large as an object that does not fit in that, and frames of that size were checked first in it.
_MAX_WALK_BYTES = 1 << 20
_MAX_CHUNKS = 4096  # chunk addresses remembered per dataset


class HeapFrames:
    """Reads a vlen uint8 dataset's elements straight from its file (see the module docs).

    Build with :meth:`of`, which answers ``None`` for any other layout.
    """

    def __init__(self, dataset, fd: int, file_bytes: int, chunk: int, offset: int | None) -> None:
        self._dataset, self._fd, self._file_bytes = dataset, fd, file_bytes
        self._chunk, self._offset = chunk, offset  # elements a chunk, or the contiguous data's address
        self._count = len(dataset)
        self._chunks: dict[int, int | None] = {}

    @classmethod
    def of(cls, dataset) -> HeapFrames | None:
        """A reader of ``dataset`` (an open h5py dataset of vlen uint8), or ``None`` if its layout is not the plain one."""
        import h5py

        try:
            fcpl, dcpl = dataset.file.id.get_create_plist(), dataset.id.get_create_plist()
            plain = (
                dataset.file.driver == "sec2"
                and fcpl.get_userblock() == 0
                and fcpl.get_sizes() == (8, 8)
                and dcpl.get_nfilters() == 0
                and dcpl.get_external_count() == 0
                and dataset.ndim == 1
            )
            layout = dcpl.get_layout()
            if not plain or layout not in (h5py.h5d.CHUNKED, h5py.h5d.CONTIGUOUS):
                return None
            chunk, offset = 0, None
            if layout == h5py.h5d.CHUNKED:
                chunk = int(dcpl.get_chunk()[0])
            else:
                offset = dataset.id.get_offset()
                if offset is None:
                    return None
            fd = os.open(dataset.file.filename, os.O_RDONLY)
        except (OSError, ValueError, RuntimeError):
            return None
        return cls(dataset, fd, os.fstat(fd).st_size, chunk, offset)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _pread(self, size: int, offset: int) -> bytearray | None:
        if offset < 0 or size < 0 or offset + size > self._file_bytes:
            return None
        buf = bytearray(size)
        return buf if os.preadv(self._fd, [buf], offset) == size else None

    def _chunk_address(self, index: int) -> int | None:
        if index not in self._chunks:
            if len(self._chunks) >= _MAX_CHUNKS:
                self._chunks.clear()
            info = self._dataset.id.get_chunk_info_by_coord((index * self._chunk,))
            whole = info.byte_offset is not None and info.filter_mask == 0 and info.size == self._chunk * _REF_BYTES
            self._chunks[index] = int(info.byte_offset) if whole else None
        return self._chunks[index]

    def _refs(self, first: int, last: int) -> bytearray | None:
        """The 16-byte references of elements ``first..last``, read chunk by chunk."""
        if self._offset is not None:
            return self._pread((last - first + 1) * _REF_BYTES, self._offset + first * _REF_BYTES)
        refs, at = bytearray(), first
        while at <= last:
            index = at // self._chunk
            address = self._chunk_address(index)
            stop = min(last + 1, (index + 1) * self._chunk)
            if address is None:
                return None
            part = self._pread((stop - at) * _REF_BYTES, address + (at % self._chunk) * _REF_BYTES)
            if part is None:
                return None
            refs += part
            at = stop
        return refs

    def _object(self, address: int, index: int, size: int) -> np.ndarray | None:
        """Heap object ``index`` of the collection at ``address``, which must hold ``size`` bytes."""
        # Where the frame is the collection's first object: header, object record and bytes in one read.
        buf = self._pread(_HEAD_BYTES + _OBJECT.size + size, address)
        if buf is None or buf[:5] != b"GCOL\x01":
            return None
        found, _, _, found_size = _OBJECT.unpack_from(buf, _HEAD_BYTES)
        if found == index and found_size == size:
            return np.frombuffer(buf, dtype=np.uint8, count=size, offset=_HEAD_BYTES + _OBJECT.size)
        (collection,) = struct.unpack_from("<Q", buf, 8)
        if collection > _MAX_WALK_BYTES:
            return None
        whole = self._pread(collection, address)
        pos = _HEAD_BYTES
        while whole is not None and pos + _OBJECT.size <= collection:
            found, _, _, found_size = _OBJECT.unpack_from(whole, pos)
            if found == 0:  # the collection's free space: the rest
                return None
            if found == index:
                start = pos + _OBJECT.size
                if found_size != size or start + size > collection:
                    return None
                return np.frombuffer(whole, dtype=np.uint8, count=size, offset=start)
            pos += _OBJECT.size + ((found_size + 7) & ~7)
        return None

    def read(self, frames) -> list[np.ndarray] | None:
        """Elements ``frames`` (indices) as writable 1-D uint8 arrays, or ``None`` for h5py to read them.

        ``None`` also for an index outside the dataset, an empty element and any reference that does
        not match its heap object: h5py names those as before.
        """
        frames = np.asarray(frames, dtype=np.int64)
        if len(frames) == 0 or self._fd < 0:
            return None
        first, last = int(frames.min()), int(frames.max())
        if first < 0 or last >= self._count:
            return None
        # One read of the clip's references, unless its frames lie so far apart that each is read alone.
        together = last - first < 4 * len(frames) + 64
        refs = self._refs(first, last) if together else None
        if together and refs is None:
            return None
        out = []
        for frame in frames:
            at = int(frame) - first
            ref = refs if refs is not None else self._refs(int(frame), int(frame))
            if ref is None:
                return None
            size, address, index = _REF.unpack_from(ref, at * _REF_BYTES if refs is not None else 0)
            data = self._object(address, index, size) if size and address and index else None
            if data is None:
                return None
            out.append(data)
        return out
