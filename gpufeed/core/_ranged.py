"""A read-only, seekable file over ranged reads: how PyAV, h5py and the tar readers read objects.

FFmpeg and HDF5 read a file by seeking and reading pieces of it. :class:`RangedFile` serves those
reads from blocks of ``block_bytes`` fetched by range, so decoding a clip from a long video fetches
the blocks around its GOP, not the file: the bytes fetched for one clip are the GOP's, a few
blocks, whatever the file's size (``gpufeed bench storage`` prints both).

* **Blocks.** A read is served from the blocks it covers; missing blocks that lie next to each
  other are fetched in one request. The last ``max_blocks`` blocks stay in memory.
* **Read-ahead.** Reads that keep continuing where the last fetch ended (a demuxer walking the
  file, the index probing every packet) fetch 1, 1, 2, 4 ... blocks at a time, up to
  ``read_ahead_bytes`` (4 MiB); a seek elsewhere goes back to one block. So a whole-file pass costs a few dozen requests, and a clip
  the blocks of its GOP.
* **Disk cache.** With ``storage.cache_dir`` set, fetched blocks are also kept on local disk
  (:class:`gpufeed.core._blob_cache.BlockCache`, bounded by ``storage.cache_max_bytes``) and read from
  there next time (the next epoch, another worker process).

Reads are counted on the file (``requests``, ``bytes_fetched``) and, for S3, in the process
(:func:`gpufeed.core._s3.fetch_stats`).
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufeed.core._blob_cache import BlockCache

__all__ = ["DEFAULT_BLOCK_BYTES", "RangedFile"]

DEFAULT_BLOCK_BYTES = 1 << 20
_READ_AHEAD_BYTES = 4 << 20


class RangedFile(io.RawIOBase):
    """A file of ``size`` bytes read through ``fetch(start, length) -> bytes`` (see the module docs).

    Args:
        name: What the file is called in messages (its URL).
        size: Its length in bytes.
        fetch: Returns ``length`` bytes from ``start`` (fewer only at the end).
        block_bytes: The unit of fetching and caching.
        max_blocks: Blocks kept in memory (at least the read-ahead's).
        read_ahead_bytes: The largest single fetch of a sequential read.
        cache: Blocks on local disk, shared by processes; ``None``: memory only.
        cache_key: What identifies this content in the cache (URL, size and entity tag).
    """

    def __init__(
        self,
        name: str,
        size: int,
        fetch: Callable[[int, int], bytes],
        *,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        max_blocks: int = 0,
        read_ahead_bytes: int = _READ_AHEAD_BYTES,
        cache: BlockCache | None = None,
        cache_key: str = "",
    ) -> None:
        super().__init__()
        if block_bytes < 1:
            raise ValueError(f"{name}: block_bytes must be >= 1, got {block_bytes}")
        self.name, self.size, self._fetch = name, int(size), fetch
        self.block_bytes = int(block_bytes)
        self.max_run = max(1, read_ahead_bytes // self.block_bytes)
        self.max_blocks = max(max_blocks, self.max_run + 2, 8)  # a read-ahead run, and the blocks it follows
        self._cache, self._cache_key = cache, cache_key or name
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._pos = 0
        self._next_sequential = -1  # the block after the last fetch: a read there is sequential
        self._run = 1
        self._streak = 0
        self.requests = 0
        self.bytes_fetched = 0
        self.cache_hits = 0

    # -- io.RawIOBase -------------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}.get(whence)
        if base is None:
            raise ValueError(f"{self.name}: whence {whence} is not one of 0, 1, 2")
        target = base + offset
        if target < 0:
            raise OSError(f"{self.name}: seek to {target}, before the start")
        self._pos = target
        return target

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        want = max(0, min(len(view), self.size - self._pos))
        if want == 0:
            return 0
        first, last = self._pos // self.block_bytes, (self._pos + want - 1) // self.block_bytes
        blocks = self._load(first, last)
        done = 0
        for index in range(first, last + 1):
            block = blocks[index]
            start = self._pos + done - index * self.block_bytes
            piece = block[start : start + want - done]
            view[done : done + len(piece)] = piece
            done += len(piece)
        self._pos += done
        return done

    def readall(self) -> bytes:
        out = bytearray(max(0, self.size - self._pos))
        got = self.readinto(out)
        return bytes(out[:got])

    # -- blocks -------------------------------------------------------------------------------
    def _load(self, first: int, last: int) -> dict[int, bytes]:
        """Blocks ``first..last``: from memory, the disk cache, or one fetch per missing run.

        Returned, not only kept: a read larger than the blocks kept in memory still gets them all.
        """
        got: dict[int, bytes] = {}
        for index in range(first, last + 1):
            block = self._blocks.get(index)
            if block is not None:
                self._blocks.move_to_end(index)
            else:
                block = self._from_cache(index)
            if block is not None:
                got[index] = block
        missing = [i for i in range(first, last + 1) if i not in got]
        if not missing:
            return got  # served from memory: the run length stays as it is
        sequential = missing[0] == self._next_sequential
        # 1, 1, 2, 4 ... blocks: a clip's read that spills into the next block fetches that block
        # only; a reader that keeps going is a pass over the file, and gets larger fetches.
        self._streak = self._streak + 1 if sequential else 0
        self._run = min(1 << max(self._streak - 1, 0), self.max_run)
        end_block = (self.size - 1) // self.block_bytes
        # A sequential read fetches ahead past what it asked for, up to the run length.
        stop = max(missing[-1], min(missing[0] + self._run - 1, end_block)) if sequential else missing[-1]
        index = missing[0]
        while index <= stop:
            if index in got or (index > last and index in self._blocks):
                index += 1
                continue
            run_end = index
            while run_end + 1 <= stop and run_end + 1 not in got and run_end + 1 not in self._blocks:
                run_end += 1
            for number, block in self._fetch_run(index, run_end).items():
                if number <= last:
                    got[number] = block
            index = run_end + 1
        self._next_sequential = stop + 1
        return got

    def _fetch_run(self, first: int, last: int) -> dict[int, bytes]:
        start = first * self.block_bytes
        length = min((last + 1) * self.block_bytes, self.size) - start
        data = self._fetch(start, length)
        if len(data) != length:
            raise OSError(f"{self.name}: asked for {length:,} bytes at {start:,}, received {len(data):,}")
        self.requests += 1
        self.bytes_fetched += len(data)
        fetched = {}
        for index in range(first, last + 1):
            lo = (index - first) * self.block_bytes
            block = fetched[index] = data[lo : lo + self.block_bytes]
            self._keep(index, block)
            if self._cache is not None:
                self._cache.put(self._block_name(index), block)
        return fetched

    def _from_cache(self, index: int) -> bytes | None:
        if self._cache is None:
            return None
        block = self._cache.get(self._block_name(index))
        expected = min(self.block_bytes, self.size - index * self.block_bytes)
        if block is None or len(block) != expected:
            return None
        self.cache_hits += 1
        self._keep(index, block)
        return block

    def _block_name(self, index: int) -> str:
        return f"{self._cache_key}\n{self.block_bytes}\n{index}"

    def _keep(self, index: int, block: bytes) -> None:
        self._blocks[index] = block
        self._blocks.move_to_end(index)
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
