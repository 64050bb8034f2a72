"""What one NVDEC clip reader costs: decoders built, decoders opened, frames at full resolution.

Read from DALI's own source (``video_reader_decoder_op.h``, ``frames_decoder_gpu.cc``; DALI 2.4,
``fn.experimental.readers.video``), what a pipeline over a file list of ``path tag start end`` lines does:

* **Building** constructs one frame decoder per list line, one after another (each opens the
  container, and on a GPU creates an NVDEC parser and 8 full-size frame buffers), to find the
  line's frame range; the index of each file is cached per process. So a list's length is the
  number of decoders a build creates, and :data:`~gpufeed.pipelines._clip_pipeline.LIST_LINES`
  caps it, also inside an epoch too long for one list (the pipeline is then rebuilt where the
  list ends).
* **Reading** constructs a new frame decoder whenever a row's file differs from the previous
  row's (rows are sorted by (video, start) within each batch, so at most once per file and batch).
* **NVDEC's hardware decoders** come from a per-GPU cache that keeps up to 100 of them for the
  life of the process, one for each (codec, coded size, chroma format, bit depth) met; each holds
  its decode surfaces in device memory. Rebuilds reuse them; a dataset of many frame sizes does not.
* **Full-resolution frames**: DALI 2.4's reader has no resize of its own, so every clip of a
  batch is decoded at full size into the reader's prefetch slot and copied, still at full size,
  into its output before ``fn.resize`` shrinks it. A DALI whose ``fn.experimental.readers`` has
  ``video_resize`` resizes right after decoding instead, and the clip pipeline uses it.

:func:`reader_budget` turns a list and the dataset's index into these figures, and
:meth:`ReaderBudget.lines` says them in the log when a reader is built.

**Rebuilds stay on the training thread, timed.** A reader's list covers whole epochs (up to 32)
or :data:`~gpufeed.pipelines._clip_pipeline.LIST_LINES` lines; when it is used up the next one is
written and built where the old one ended. Building it on another thread would not take it off
the training thread's path: DALI's Python binding of ``Pipeline.Build`` (``backend_impl.cc``)
does not release Python's lock, so the thread that trains waits through the whole build whichever
thread runs it (measured on the CPU, 8,192 lines of a VP9 list: builds of 0.49-0.79 s in a second
thread stopped the main thread for 485-789 ms, the whole build, load 3.7). Each build is timed
instead (:class:`ReaderBuild`, logged on a GPU, kept in ``ClipLoader.reader_builds``) so a GPU run
shows what its rebuilds cost. The first GPU figures (an H100, DALI 2.4): 6,912 lines in 53.8-56.9 s,
about 8 ms a line against 0.06-0.1 ms on the CPU, so a GPU build that slow is a warning.

**One reader per rank.** DALI's GPU reader decodes the samples of a batch one after another in
its prefetch thread (``VideoReaderDecoderGpu::Prefetch`` calls each sample's ``Decode`` in turn),
so a reader keeps one NVDEC session, about one engine, busy; an H100 has 7. Several readers per
rank would each need their own list, pipeline and DALI threads, and a batch split among them and
joined again; whether decode, not the rest of the step, bounds a clip run is unmeasured (no GPU
was lent to this work), so it is left until a GPU run shows NVDEC as the bottleneck (``nvidia-smi
dmon -s u``: one ``dec`` engine near 100% while the step waits on the loader).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from gpufeed.pipelines._nvdec import pix_fmt_facts

__all__ = [
    "ReaderBudget",
    "ReaderBuild",
    "decoder_opens",
    "fused_reader_resize",
    "log_reader_budget",
    "log_reader_build",
    "nvdec_formats",
    "reader_budget",
]

log = logging.getLogger("gpufeed")

# DALI's NVDEC decoder cache keeps at most this many hardware decoders per GPU (CACHE_SIZE_LIMIT).
NVDEC_CACHE_LIMIT = 100
# Decode surfaces per hardware decoder when the stream does not say how many it needs (DALI's default).
DECODE_SURFACES = 20
# More distinct formats than this, or more estimated memory than WARN_BYTES, is logged as a warning.
WARN_FORMATS = 16
WARN_BYTES = 8 << 30


def fused_reader_resize(on_gpu: bool) -> tuple[bool, str]:
    """Whether the NVDEC reader resizes frames itself in this DALI, and why (not)."""
    if not on_gpu:
        return False, "the CPU reader decodes at full size, then fn.resize"
    from nvidia.dali import fn

    if hasattr(fn.experimental.readers, "video_resize"):
        return True, "fn.experimental.readers.video_resize resizes each clip right after NVDEC decodes it"
    import nvidia.dali as dali

    return False, (
        f"DALI {dali.__version__} has no resize inside fn.experimental.readers.video (video_resize comes in a "
        "later DALI): clips are decoded at full size, then fn.resize"
    )


def decoder_opens(videos) -> int:
    """Frame decoders DALI's reader constructs reading rows of these video ids in this order.

    One for the first row and one for every row whose file differs from the previous row's.
    """
    videos = np.asarray(videos)
    return int(len(videos) > 0) + int(np.count_nonzero(videos[1:] != videos[:-1]))


def _coded(size: int) -> int:
    return -(-size // 16) * 16  # NVDEC decodes whole 16-pixel macroblocks


def nvdec_formats(infos) -> dict[tuple, int]:
    """(codec, coded width, coded height, chroma, bit depth) -> bytes of one hardware decoder's surfaces.

    Each distinct key is one hardware decoder in DALI's per-GPU cache; its size is estimated
    from :data:`DECODE_SURFACES` surfaces of NV12 (or 16-bit P016 above 8 bits).
    """
    formats = {}
    for info in infos:
        chroma, bits = pix_fmt_facts(info.pix_fmt) if info.pix_fmt else ("420", 8)
        key = (info.codec, _coded(info.width), _coded(info.height), chroma, bits)
        per_pixel = 1.5 * (2 if bits > 8 else 1)
        formats[key] = int(DECODE_SURFACES * key[1] * key[2] * per_pixel)
    return formats


@dataclass(frozen=True)
class ReaderBudget:
    """What one NVDEC reader over one file list costs (see the module docs).

    Attributes:
        lines: List lines, which is also the number of frame decoders the build constructs.
        capped: Whether the list ends inside an epoch because of the line cap.
        batches: Batches (pipeline iterations) the list covers.
        opens: Frame decoders constructed while reading the list in reader order.
        opens_plan_order: The same, had the rows stayed in plan order.
        formats: Distinct NVDEC formats among the videos, one hardware decoder each.
        surface_bytes: Their decode surfaces (estimate).
        full_res_bytes: Full-resolution frames in flight (estimate).
        largest: (width, height) of the largest frames.
        fused: Whether the reader resizes frames itself.
        fused_reason: Why (not).
    """

    lines: int
    capped: bool
    batches: int
    opens: int
    opens_plan_order: int
    formats: int
    surface_bytes: int
    full_res_bytes: int
    largest: tuple[int, int]
    fused: bool
    fused_reason: str

    @property
    def warn(self) -> bool:
        return self.formats > WARN_FORMATS or self.surface_bytes + self.full_res_bytes > WARN_BYTES

    def lines_text(self) -> list[str]:
        """Log lines: decoders the build and the reading create, then memory."""
        gib = 1 << 30
        cap = (
            f" (capped at {self.lines} lines, inside the epoch: a new pipeline continues after them)"
            if self.capped
            else ""
        )
        width, height = self.largest
        cache = f" (DALI keeps at most {NVDEC_CACHE_LIMIT})" if self.formats > NVDEC_CACHE_LIMIT else ""
        hint = (
            "; re-encode the videos to fewer frame sizes ('gpufeed prepare') or use a smaller batch_size"
            if self.warn
            else ""
        )
        return [
            f"NVDEC clip reader: a list of {self.lines} clips for {self.batches} batches{cap}; building it constructs "
            f"{self.lines} frame decoders (one per line), reading it {self.opens} (one per file change; "
            f"{self.opens_plan_order} in plan order)",
            f"NVDEC memory: {self.formats} video format(s), so {min(self.formats, NVDEC_CACHE_LIMIT)} hardware "
            f"decoder(s) kept per GPU{cache} with about {self.surface_bytes / gib:.2f} GiB of decode surfaces; "
            f"full-resolution frames in flight about {self.full_res_bytes / gib:.2f} GiB (clips up to "
            f"{width}x{height}); {self.fused_reason}{hint}",
        ]


def reader_budget(
    infos,
    reader_videos,
    plan_videos,
    *,
    batch_size: int,
    clip_length_frames: int,
    capped: bool,
    fused: bool,
    fused_reason: str,
) -> ReaderBudget:
    """The figures of one reader list (see :class:`ReaderBudget`).

    Args:
        infos: :class:`~gpufeed.pipelines._videos.VideoInfo` of every video the list may name.
        reader_videos: Video id of every list line, in list (reader) order.
        plan_videos: The same rows in plan order.
        batch_size: Rows per batch.
        clip_length_frames: Frames per clip.
        capped: Whether the list was cut inside an epoch.
        fused, fused_reason: From :func:`fused_reader_resize`.
    """
    reader_videos = np.asarray(reader_videos)
    used = [infos[int(v)] for v in np.unique(reader_videos)]
    formats = nvdec_formats(used)
    width = max((info.width for info in used), default=0)
    height = max((info.height for info in used), default=0)
    # The reader's one prefetch slot (prefetch_queue_depth 1) holds a batch of decoded clips;
    # without a fused resize the reader also copies that batch into its output for fn.resize.
    batches_in_flight = 1 if fused else 2
    full_res = batches_in_flight * batch_size * clip_length_frames * width * height * 3
    return ReaderBudget(
        lines=len(reader_videos),
        capped=capped,
        batches=len(reader_videos) // max(1, batch_size),
        opens=decoder_opens(reader_videos),
        opens_plan_order=decoder_opens(plan_videos),
        formats=len(formats),
        surface_bytes=sum(formats.values()),
        full_res_bytes=full_res,
        largest=(width, height),
        fused=fused,
        fused_reason=fused_reason,
    )


def log_reader_budget(infos, listed, batch_size: int, geometry, on_gpu: bool) -> bool:
    """Log what a DALI reader over ``listed`` (a :class:`~gpufeed.pipelines._clip_pipeline.ReaderList`) costs.

    On the CPU only a list cut inside an epoch is worth a line; on a GPU both lines of
    :meth:`ReaderBudget.lines_text` are logged (a warning when :attr:`ReaderBudget.warn`).

    Returns:
        Whether the reader resizes clips itself (:func:`fused_reader_resize`).
    """
    fused, reason = fused_reader_resize(on_gpu)
    budget = reader_budget(
        infos,
        listed.videos,
        listed.plan_videos,
        batch_size=batch_size,
        clip_length_frames=geometry.clip_length_frames,
        capped=listed.capped,
        fused=fused,
        fused_reason=reason,
    )
    decoders, memory = budget.lines_text()
    if on_gpu:
        log.info("%s", decoders)
        log.log(logging.WARNING if budget.warn else logging.INFO, "%s", memory)
    elif budget.capped:
        log.info("%s", decoders.replace("NVDEC clip reader", "DALI clip reader", 1))
    return fused


@dataclass(frozen=True)
class ReaderBuild:
    """How long one DALI video reader took to make (see the module docs, *Rebuilds*).

    Attributes:
        lines: Lines of its file list (frame decoders the build constructs).
        capped: Whether the list stops inside an epoch (another build follows it there).
        list_s: Writing the list (planning each batch's rows, in Python).
        build_s: DALI's ``Pipeline.build``, the reader's index and per-line decoders included.
    """

    lines: int
    capped: bool
    list_s: float
    build_s: float

    @property
    def total_s(self) -> float:
        return self.list_s + self.build_s

    def text(self, number: int, on_gpu: bool) -> str:
        """The log line of build ``number`` (1: the loader's first)."""
        what = "NVDEC clip reader" if on_gpu else "DALI clip reader"
        kind = "built" if number == 1 else f"rebuilt (build {number})"
        return (
            f"{what} {kind} in {self.total_s:.2f} s for {self.lines} lines: list {self.list_s:.2f} s, DALI build "
            f"{self.build_s:.2f} s (the training thread waits through both: DALI's build holds Python's lock)"
        )


# A GPU build slower than this per list line is a warning: an H100 took about 8 ms a line (6,912
# lines in 53.8-56.9 s, three builds), the CPU 0.06-0.1 ms; every clip pays it before any decoding.
SLOW_BUILD_MS_PER_LINE = 2.0


def log_reader_build(build: ReaderBuild, number: int, on_gpu: bool) -> None:
    """Log how long a reader took to make: on a GPU every time, on the CPU when lists are capped.

    A GPU build slower than :data:`SLOW_BUILD_MS_PER_LINE` a line is a warning that says what each
    clip pays for it and how to compare with PyAV's worker processes, which build nothing per clip.
    """
    per_line_ms = 1000 * build.build_s / build.lines if build.lines else 0.0
    if on_gpu and per_line_ms >= SLOW_BUILD_MS_PER_LINE:
        log.warning(
            "%s; that is %.1f ms a clip on the training thread before NVDEC decodes it (DALI constructs a frame "
            "decoder per line): compare with PyAV's worker processes, 'gpufeed bench clips --device gpu --decoder "
            "pyav', and set video.decoder: pyav if they are faster",
            build.text(number, on_gpu),
            per_line_ms,
        )
    elif on_gpu or build.capped or number > 1:
        log.info("%s", build.text(number, on_gpu))
