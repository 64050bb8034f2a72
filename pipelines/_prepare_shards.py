"""``gpufeed prepare SRC --shards DIR``: write an image split or a video folder as WebDataset-style tar shards.

The layout is :mod:`gpufeed.pipelines._shards`'s. Images are copied byte for byte (their facts
from the image index: size, EXIF orientation); clips are decoded once, with the clip loader's own
decoder, at their evaluation starts, and each frame is stored as a JPEG (or PNG) of the decoded
RGB frame. Unusable files (a bad image, a video with a problem) are left out and reported, as
``gpufeed check`` would name them. Tars are ustar (no PAX headers), with zero timestamps and
owners, so the same input writes the same bytes. A shard is closed when it passes
``shard_bytes``; ``shards.json`` is written last, so a folder without it is an unfinished run.
``DIR`` may be ``s3://bucket/prefix``: the shards are written to a local temporary folder first,
then uploaded, the manifest last.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpufeed.core import S3Path, data_path, progress_bar, read_bytes, s3_upload_file, write_json
from gpufeed.pipelines._clips import ClipGeometry
from gpufeed.pipelines._dataset import ImageDataset
from gpufeed.pipelines._pyav import ClipDecodeError, ClipDecoder, VideoRef
from gpufeed.pipelines._shards import CLIP_COLUMNS, IMAGE_COLUMNS, MANIFEST_NAME, SHARD_FORMAT, SHARD_VERSION
from gpufeed.pipelines._videos import VideoDataset

__all__ = ["ShardReport", "write_clip_shards", "write_image_shards"]

DEFAULT_SHARD_BYTES = 256 << 20


@dataclass
class ShardReport:
    """What a shard run wrote and what it left out.

    Attributes:
        out: The shard folder.
        kind: ``"images"`` or ``"clips"``.
        samples: Samples written.
        shards: Tar files written.
        bytes: Their total size.
        skipped: ``(source, why)`` of every file left out.
    """

    out: str
    kind: str
    samples: int = 0
    shards: int = 0
    bytes: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**self.__dict__, "skipped": [list(s) for s in self.skipped]}


class _ShardWriter:
    """Tar shards of whole samples into a local folder, with their DALI index files and manifest rows."""

    def __init__(self, folder: Path, shard_bytes: int) -> None:
        self.folder, self.shard_bytes = folder, shard_bytes
        self.names: list[str] = []
        self.sizes: list[int] = []
        self.counts: list[int] = []
        self._tar: tarfile.TarFile | None = None
        self._index: list[str] = []

    def _open(self) -> tarfile.TarFile:
        if self._tar is None:
            name = f"shard-{len(self.names):06d}.tar"
            self.names.append(name)
            # Closed by close(), when the shard is full or the run ends: one stays open across samples.
            self._tar = tarfile.open(self.folder / name, "w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
            self._index = []
        return self._tar

    def add(self, key: str, members: list[tuple[str, bytes]]) -> tuple[int, int, int, list[int]]:
        """Write one sample's members (``(ext, bytes)``); returns (shard, span start, span size, data offsets)."""
        tar = self._open()
        start = tar.offset
        offsets, line = [], []
        for ext, data in members:
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            header = tar.offset
            tar.addfile(info, io.BytesIO(data))
            offsets.append(header + 512)  # one ustar header block: names are short ASCII
            line.append(f"{ext} {header + 512} {len(data)} {key}.{ext}")
        self._index.append(" ".join(line))
        shard = len(self.names) - 1
        span = tar.offset - start
        if tar.offset >= self.shard_bytes:
            self.close()
        return shard, start, span, offsets

    def close(self) -> None:
        """Finish the open shard (end-of-archive blocks) and write its DALI index (format v1.2)."""
        if self._tar is None:
            return
        self._tar.close()
        name = self.names[-1]
        (self.folder / name).with_suffix(".idx").write_text(
            f"v1.2 {len(self._index)}\n" + "\n".join(self._index) + "\n", encoding="ascii"
        )
        self.sizes.append((self.folder / name).stat().st_size)
        self.counts.append(len(self._index))
        self._tar = None

    def manifest(self, kind: str, names, columns, rows, **extra) -> None:
        self.close()
        shards = [
            {"name": n, "bytes": b, "samples": c} for n, b, c in zip(self.names, self.sizes, self.counts, strict=True)
        ]
        document = {
            "format": SHARD_FORMAT,
            "version": SHARD_VERSION,
            "kind": kind,
            "names": list(names),
            "columns": list(columns),
            **extra,
            "shards": shards,
            "rows": rows,
        }
        write_json(self.folder / MANIFEST_NAME, document, compact=True, atomic=True)


def _finish(writer: _ShardWriter, local: Path, out, report: ShardReport) -> ShardReport:
    report.shards, report.bytes = len(writer.names), sum(writer.sizes)
    if isinstance(out, S3Path):
        for name in sorted(os.listdir(local), key=lambda n: n == MANIFEST_NAME):  # the manifest last
            s3_upload_file(local / name, out / name)
    return report


def _target(out: str | Path | S3Path) -> tuple[Path | S3Path, Path, tempfile.TemporaryDirectory | None]:
    """(the destination, the local folder shards are written into, the temporary folder to remove or None)."""
    dest = data_path(out)
    # In a bucket too: readers holding the old manifest would read the new shards at its offsets.
    if (dest / MANIFEST_NAME).is_file():
        raise FileExistsError(f"{dest} already holds shards ({MANIFEST_NAME}); write into an empty folder or prefix")
    if isinstance(dest, S3Path):
        tmp = tempfile.TemporaryDirectory(prefix="gpufeed-shards-")
        return dest, Path(tmp.name), tmp
    dest.mkdir(parents=True, exist_ok=True)
    return dest, dest, None


def write_image_shards(
    dataset: ImageDataset, out, *, shard_bytes: int = DEFAULT_SHARD_BYTES, progress: bool = False
) -> ShardReport:
    """Write ``dataset``'s usable images (with their labels) as shards in ``out`` (see the module docs)."""
    dest, local, tmp = _target(out)
    report = ShardReport(str(dest), "images")
    writer = _ShardWriter(local, shard_bytes)
    rows: list[list] = []
    base = os.path.commonpath([str(p) for p in dataset.paths]) if not dataset.source.startswith("list") else ""
    usable = set(dataset.usable_ids.tolist())
    try:
        for i in progress_bar(range(len(dataset)), desc="image shards", unit="img", disable=not progress):
            path = dataset.paths[i]
            if i not in usable:
                report.skipped.append((path, dataset.problems.get(i, "not usable")))
                continue
            ext = "png" if path.lower().endswith(".png") else "jpg"
            key = f"{len(rows):08d}"
            label = int(dataset.labels[i])
            data = read_bytes(path)
            shard, _start, _span, (offset, _cls) = writer.add(key, [(ext, data), ("cls", str(label).encode())])
            width, height = (int(v) for v in dataset.sizes[i])
            orientation = int(dataset.orientations[i]) if dataset.orientations is not None else 1
            source = os.path.relpath(path, base) if base else path
            rows.append([key, shard, offset, len(data), ext, label, width, height, orientation, source])
        writer.manifest("images", dataset.classes, IMAGE_COLUMNS, rows)
        report.samples = len(rows)
        return _finish(writer, local, dest, report)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _encode(frame: np.ndarray, image_format: str, quality: int) -> bytes:
    if image_format == "jpeg":
        import simplejpeg

        return simplejpeg.encode_jpeg(np.ascontiguousarray(frame), quality=quality, colorspace="RGB")
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG")
    return buffer.getvalue()


def write_clip_shards(
    dataset: VideoDataset,
    out,
    *,
    clip_length_frames: int = 11,
    stride_frames: int = 1,
    image_format: str = "jpeg",
    jpeg_quality: int = 95,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: bool = False,
) -> ShardReport:
    """Write every evaluation clip of ``dataset``'s usable videos, frames and per-frame labels, as shards in ``out``."""
    if image_format not in ("jpeg", "png"):
        raise ValueError(f"image_format {image_format!r} is not allowed; allowed: jpeg, png")
    geometry = ClipGeometry(clip_length_frames, stride_frames)
    dest, local, tmp = _target(out)
    report = ShardReport(str(dest), "clips")
    writer = _ShardWriter(local, shard_bytes)
    ext = "jpg" if image_format == "jpeg" else "png"
    rows: list[list] = []
    decoder = ClipDecoder()
    usable = set(dataset.usable_ids.tolist())
    try:
        for v in progress_bar(range(len(dataset)), desc="clip shards", unit="video", disable=not progress):
            info, path = dataset.infos[v], dataset.paths[v]
            if v not in usable:
                report.skipped.append((path, dataset.problems.get(v, "not usable")))
                continue
            labels = dataset.labels[v]
            assert labels is not None, "a usable video has labels"
            for start in geometry.eval_starts(info.num_frames).tolist():
                frames = geometry.frames(start)
                try:
                    rgb = decoder.read(VideoRef.from_info(info), frames)
                except ClipDecodeError as err:
                    report.skipped.append((path, str(err)))
                    break
                key = f"{len(rows):08d}"
                clip_labels = np.ascontiguousarray(labels[frames], dtype=np.uint8)
                npy = io.BytesIO()
                np.save(npy, clip_labels)
                meta = {"video": path, "start": start, "stride": stride_frames, "behaviours": list(dataset.behaviours)}
                members = [
                    (f"f{t:04d}.{ext}", _encode(frame, image_format, jpeg_quality)) for t, frame in enumerate(rgb)
                ]
                members += [("labels.npy", npy.getvalue()), ("json", json.dumps(meta).encode())]
                shard, span_start, span, _ = writer.add(key, members)
                bits = ["".join(str(int(b)) for b in row) for row in clip_labels]
                height, width = rgb.shape[1:3]
                rows.append([key, shard, span_start, span, len(frames), width, height, bits, path, start, ext])
        writer.manifest(
            "clips",
            dataset.behaviours,
            CLIP_COLUMNS,
            rows,
            clip_length_frames=clip_length_frames,
            stride_frames=stride_frames,
        )
        report.samples = len(rows)
        return _finish(writer, local, dest, report)
    finally:
        decoder.close()
        if tmp is not None:
            tmp.cleanup()
