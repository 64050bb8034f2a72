"""A video that arrives as bytes (a request body), and one-line errors of the sequential reader.

The sequential reader (:class:`~gpufeed.pipelines.VideoFrameReader`) reads files: NVDEC through
DALI's video reader on a GPU, PyAV on a CPU, each from a path. :class:`VideoBytes` gives an
encoded video held in memory such a path: its container is recognised from its first bytes (MP4/MOV
``ftyp``, AVI ``RIFF....AVI``, Matroska/WebM's EBML header; anything else is refused before a byte is
written), the bytes go to a private temporary folder under a name with that container's suffix (so
the index's checks apply, the MP4 box walk included), and the file is probed as the index probes
every video: codec, frame count, size, duration, and the first problem found. The folder goes when
the object is closed. The bytes are bounded by whoever read them (the server's body limit); the
file holds them once.

:func:`read_in_order` runs a sequential reader and turns what a decode failure raises (DALI's
several-line error around a Python traceback, PyAV's message) into one line naming the video and
the frame where decoding stopped.

Where this should go (the clip decode sources are being refactored into classes): decoding from
memory belongs in the sequential reader's sources (PyAV opens a ``BytesIO``; DALI's
``fn.experimental.decoders.video`` decodes encoded bytes on the GPU), and the one-line error in the
reader itself; until then, these wrap the public reader.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpufeed.pipelines._containers import CONTAINERS, KNOWN_HEADERS, SNIFF_BYTES, sniff_container
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._videos import VideoInfo, probe_video

__all__ = ["CONTAINERS", "VideoBytes", "first_line", "read_in_order", "sniff_container"]


def first_line(message: str, limit: int = 300) -> str:
    """The line of an error message that says what went wrong, cut to ``limit`` characters.

    DALI wraps an exception raised in a Python source in several lines of context and a traceback;
    the line naming gpufeed's own error (``ClipDecodeError: ...``) or, failing that, the last line
    of the traceback is the one a user needs.
    """
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return "no message"
    named = [line for line in lines if "ClipDecodeError:" in line or "DatasetError:" in line]
    line = named[-1].split("Error: ", 1)[-1] if named else (lines[-1] if len(lines) > 1 else lines[0])
    return line if len(line) <= limit else f"{line[: limit - 3]}..."


def read_in_order(reader, name: str | None = None) -> Iterator:
    """The chunks of a :class:`~gpufeed.pipelines.VideoFrameReader`; a failure is one :class:`DatasetError` line.

    Args:
        reader: The reader.
        name: How to name the video in the message (default: its path).

    Raises:
        DatasetError: ``"<name>: decoding stopped after <n> of <N> frames: <reason>"``.
    """
    done = 0
    label = name or str(reader.info.path)
    try:
        for chunk in reader:
            done += len(chunk)
            yield chunk
    except DatasetError as err:
        text = str(err)
        path = str(reader.info.path)
        raise DatasetError(label + text[len(path) :] if text.startswith(path) else f"{label}: {text}") from None
    except (RuntimeError, ValueError, OSError) as err:
        line = first_line(str(err))
        path = str(reader.info.path)
        if line.startswith(path + ": "):  # the decoder named the file: name it once, as the caller does
            line = line[len(path) + 2 :]
        if not line.startswith("decoding stopped"):  # else the decoder counted its own frames: it knows best
            line = f"decoding stopped after {done} of {reader.info.num_frames} frames: {line}"
        raise DatasetError(f"{label}: {line}") from None


class VideoBytes:
    """An encoded video held in memory, as a probed temporary file (see the module docs).

    Use as a context manager, or call :meth:`close`::

        with VideoBytes(body) as video:
            video.info.num_frames, video.info.codec, video.path

    Args:
        blob: The encoded video.
        name: How messages name it (``"the request body"``).

    Attributes:
        container: ``mp4``, ``avi`` or ``matroska``.
        path: The temporary file.
        info: Its :class:`~gpufeed.pipelines._videos.VideoInfo` (``info.problem`` says why it cannot be
            read, if it cannot).

    Raises:
        DatasetError: The bytes are no container gpufeed reads (one line naming ``name``), or empty.
    """

    def __init__(self, blob: bytes, name: str = "the video") -> None:
        self.name = name
        if not blob:
            raise DatasetError(f"{name} is empty (0 bytes)")
        container = sniff_container(bytes(blob[:SNIFF_BYTES]))
        if container is None:
            raise DatasetError(f"{name} is not a video container gpufeed reads: its first bytes are no {KNOWN_HEADERS}")
        self.container = container
        self._folder = Path(tempfile.mkdtemp(prefix="gpufeed-video-"))
        try:
            self.path = self._folder / f"video{CONTAINERS[container]}"
            self.path.write_bytes(blob)
            self.info: VideoInfo = probe_video(self.path)
        except BaseException:
            self.close()
            raise

    @property
    def problem(self) -> str | None:
        """Why the video cannot be read (naming it by ``name``, never by its temporary path), or ``None``."""
        return self.info.problem

    def __enter__(self) -> VideoBytes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the temporary file and its folder."""
        shutil.rmtree(self._folder, ignore_errors=True)
