"""Video containers known by their first bytes: MP4/MOV, AVI, Matroska/WebM and MPEG-TS.

FFmpeg's answer to a file that is no video at all is ``Invalid data found when processing input``
(with an errno such as 1094995529); the first bytes say more plainly what is wrong: the file does
not start as its name says it should. The server refuses a request body by the same test
(:class:`~gpufeed.pipelines._video_bytes.VideoBytes`).
"""

from __future__ import annotations

from pathlib import Path

from gpufeed.core import ObjectPath, open_binary

__all__ = ["CONTAINERS", "KNOWN_HEADERS", "SNIFF_BYTES", "header_problem", "sniff_container"]

# Container -> suffix of its file. Raw streams are left out: no timestamps to count frames by,
# which every limit here needs (the probe counts an MPEG transport stream's packets).
CONTAINERS = {"mp4": ".mp4", "avi": ".avi", "matroska": ".mkv", "mpegts": ".ts"}
# Bytes a container is recognised from: an MPEG-TS packet is 188 bytes, each starting 0x47.
SNIFF_BYTES = 2 * 188 + 1
KNOWN_HEADERS = "MP4/MOV, AVI, Matroska/WebM or MPEG-TS header"

# File suffix -> the header a file of that name starts with.
_EXPECTED = {
    ".mp4": "an MP4/MOV 'ftyp' header",
    ".mov": "an MP4/MOV 'ftyp' header",
    ".m4v": "an MP4/MOV 'ftyp' header",
    ".mkv": "a Matroska/WebM (EBML) header",
    ".webm": "a Matroska/WebM (EBML) header",
    ".avi": "an AVI 'RIFF' header",
    ".ts": "an MPEG-TS header (0x47 sync bytes)",
    ".mts": "an MPEG-TS header (0x47 sync bytes)",
    ".m2ts": "an MPEG-TS header (0x47 sync bytes)",
}


def sniff_container(head: bytes) -> str | None:
    """The container of an encoded video from its first bytes (``mp4``, ``avi``, ``matroska``, ``mpegts``), or ``None``.

    ``head``: up to :data:`SNIFF_BYTES` of them (an MPEG transport stream is known by three packets'
    sync bytes, or as many as the bytes hold).
    """
    if len(head) >= 12 and head[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide"):
        return "mp4"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if len(head) > 188 and all(head[k] == 0x47 for k in range(0, len(head), 188)):
        return "mpegts"
    return None


def header_problem(path: Path | ObjectPath) -> str | None:
    """Why ``path`` is no video by its first bytes (naming the header its suffix promises), or ``None``.

    ``None`` too when the bytes cannot be read (the caller's own error says why) or start as a
    known container does (then the container itself is damaged, and the decoder's reason is the one to give).
    """
    try:
        with open_binary(path) as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return None
    if sniff_container(head) is not None:
        return None
    expected = _EXPECTED.get(Path(str(path)).suffix.lower(), "a video container's header")
    return f"not a video: the file does not start with {expected} (its first bytes are no {KNOWN_HEADERS})"
