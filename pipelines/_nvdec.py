"""Which videos NVIDIA's hardware decoder (NVDEC) takes, and which decoder each video gets.

DALI's GPU video reader hands every file to NVDEC; a file NVDEC cannot decode fails its first
batch (a ``PipelineError`` mid-run), although PyAV decodes it fine. So the choice is made per
video, up front, from what the index knows: codec, profile, pixel format (chroma subsampling and
bit depth) and size, checked against NVIDIA's NVDEC support matrix (Video Codec SDK). The GPU's
own abilities matter for AV1 only: the data-centre parts (A100, H100, compute capability 8.0 and
9.0) have no AV1 decoder, the GA10x/AD10x ones (8.6, 8.9) and Blackwell (10.x, 12.x) do.

Some videos no DALI reader takes, on any device, because it would hand over other frames than
PyAV's reads: a display matrix (DALI returns the stored frames), an edit list (it counts the
hidden frames), an MPEG transport stream (it trusts FFmpeg's late seeks), several video streams or
a cover picture (it might open another stream), a colour matrix other than BT.601 (DALI converts
with BT.601 whatever the file says), interlacing (its GPU reader converts each field picture as it
decodes it, so may hand over a frame with one field decoded). A video NVDEC or DALI's reader cannot take is
decoded with PyAV. The clip loader reads all of a dataset through one pipeline, so one such video
moves the whole dataset to PyAV under ``video.decoder: auto`` (logged, with the videos and why),
and is refused up front under ``video.decoder: dali``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._videos import DALI_CPU_CODECS

__all__ = ["DecoderChoice", "choose_decoder", "gpu_capability", "nvdec_problem", "pix_fmt_facts"]

# Per codec: (chroma formats, bit depths, smallest (width, height), largest width/height) NVDEC
# decodes, from NVIDIA's NVDEC support matrix for Turing to Hopper. 4:2:2 only arrives with Blackwell
# (JPEG aside), so it is left out; hevc 4:4:4 too, although NVDEC decodes it, because DALI 2.4's GPU
# reader cannot output it (below). The smallest sizes are the decoder capabilities' minimums: below one, DALI's
# reader fails the whole pipeline at its first clip (a 96x64 hevc video on an H200: "Video is too
# small in at least one dimension ... supported: 144x144").
_NVDEC = {
    "h264": (("420", "400"), (8,), (48, 16), 4096),
    # No 4:4:4: DALI 2.4's GPU reader creates every decoder with an NV12 output surface (it never
    # sets OutputFormat) and converts NV12 only (color_space.cu), while 4:4:4 needs a YUV444 one.
    "hevc": (("420", "400"), (8, 10, 12), (144, 144), 8192),
    "vp8": (("420",), (8,), (48, 16), 4096),
    "vp9": (("420",), (8, 10, 12), (128, 128), 8192),
    "av1": (("420", "400"), (8, 10), (128, 128), 8192),
    "mpeg4": (("420",), (8,), (48, 16), 2032),
}
# Codecs NVDEC decodes but DALI 2.4's GPU reader does not take: it drops such files when it opens
# them (frames_decoder_gpu.cc logs "Codec 7 (mjpeg) is not supported by the GPU variant"), and a
# dataset of them only leaves a reader with no samples (measured on an H200).
_GPU_READER_LACKS = ("mjpeg",)
# h264 profiles NVDEC decodes (FFmpeg's names); High 10/4:2:2/4:4:4 and the intra profiles it does not.
_H264_PROFILES = ("Baseline", "Constrained Baseline", "Main", "Extended", "High", "")
# Compute capabilities whose NVDEC has AV1 (GA10x, AD10x, Blackwell); A100 (8.0) and H100 (9.0) do not.
_AV1_CAPABILITIES = ((8, 6), (8, 7), (8, 9), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1))
# Colour matrices DALI 2.4's readers convert as PyAV does (VideoInfo.colour_matrix): BT.601 under
# either FFmpeg name, and none said ("" not probed), which FFmpeg's swscale reads as BT.601 too.
# DALI's NVDEC kernel (color_space.cu) converts every video with BT.601, reading only the full-range
# flag, and its CPU reader measured the same; PyAV converts with the frame's own matrix. A BT.709
# video (phones, HD cameras) came out up to 22 levels apart in saturated colours (VP9 colour bars).
_BT601_MATRICES = ("", "unspecified", "bt470bg", "smpte170m")
_MATRIX_WORDS = {
    "bt709": "BT.709",
    "bt2020nc": "BT.2020",
    "bt2020c": "BT.2020 (constant luminance)",
    "smpte240m": "SMPTE 240M",
    "fcc": "FCC",
    "ycgco": "YCgCo",
    "gbr": "GBR (RGB stored as it is)",
}


def gpu_capability(device) -> tuple[int, int] | None:
    """CUDA compute capability of a :class:`gpufeed.device.DeviceChoice`'s GPU (``None`` on the CPU)."""
    if not device.is_gpu:
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(device.device_id)
    return major, minor


def pix_fmt_facts(pix_fmt: str) -> tuple[str, int]:
    """(chroma format ``"420"``/``"422"``/``"444"``/``"400"``, bits per component) of an FFmpeg pixel format.

    Unknown formats read as ``("", 8)``.
    """
    name = pix_fmt.lower()
    if name.startswith("gray"):
        chroma = "400"
    elif name.startswith(("nv12", "nv21", "p010", "p012", "p016")):
        chroma = "420"
    else:
        found = re.search(r"(420|422|444|440|411|410)", name)
        chroma = found.group(1) if found else ""
    bits = re.search(r"(?:p|gray)(9|10|12|14|16)(le|be)$", name) or re.match(r"p0(10|12|16)", name)
    return chroma, int(bits.group(1)) if bits else 8


def nvdec_problem(info, capability: tuple[int, int] | None = None) -> str | None:
    """Why NVDEC cannot decode this video, or ``None`` when it can.

    Args:
        info: A :class:`gpufeed.pipelines._videos.VideoInfo` (codec, profile, pix_fmt, size).
        capability: The GPU's CUDA compute capability (decides AV1); ``None``: AV1 counts as not
            decodable, as on the A100/H100 this project trains on.
    """
    codec = info.codec
    if codec in _GPU_READER_LACKS:
        return f"{codec}: DALI's GPU video reader does not decode {codec} (NVDEC would; DALI 2.4 drops such files)"
    if codec not in _NVDEC:
        return f"NVDEC has no {codec} decoder"
    chromas, depths, smallest, largest = _NVDEC[codec]
    chroma, bits = pix_fmt_facts(info.pix_fmt) if info.pix_fmt else ("420", 8)
    profile = getattr(info, "profile", "") or ""
    if codec == "av1" and (capability is None or tuple(capability) not in _AV1_CAPABILITIES):
        where = "this GPU" if capability is None else f"this GPU (compute capability {capability[0]}.{capability[1]})"
        return f"av1: {where} has no AV1 decoder in NVDEC (A100 and H100 have none; GA10x, AD10x and Blackwell do)"
    if codec == "h264" and profile not in _H264_PROFILES:
        return f"h264 profile {profile!r}: NVDEC decodes h264 Baseline, Main and High (8-bit 4:2:0) only"
    if chroma and chroma not in chromas:
        kept = "/".join(f"4:{c[1]}:{c[2]}" for c in chromas)
        return f"{codec} {info.pix_fmt}: DALI's NVDEC reader decodes {codec} with {kept} chroma only"
    if bits not in depths:
        return f"{codec} {info.pix_fmt}: {bits}-bit; NVDEC decodes {codec} at {'/'.join(map(str, depths))} bits"
    if info.width < smallest[0] or info.height < smallest[1]:
        return f"{codec} {info.width}x{info.height}: smaller than NVDEC's {smallest[0]}x{smallest[1]} for {codec}"
    if info.width % 2 or info.height % 2:
        # DALI 2.4's NV12 to RGB kernel (color_space.cu) writes 2x2 pixels a thread, checking only
        # the even corner, and reads chroma from height x pitch where NVDEC starts it at the height
        # rounded up to even: wrong colours and writes past the frame, with no error.
        return f"{codec} {info.width}x{info.height}: an odd frame size, which DALI's NVDEC reader turns into wrong RGB"
    if max(info.width, info.height) > largest:
        return f"{codec} {info.width}x{info.height}: larger than NVDEC's {largest}x{largest} for {codec}"
    return None


@dataclass(frozen=True)
class DecoderChoice:
    """The decoder a dataset gets, why, and the videos DALI's reader cannot take.

    Attributes:
        source: ``"dali"`` (NVDEC on a GPU, DALI's CPU reader otherwise) or ``"pyav"``.
        reason: Why, in words, for logs and run summaries.
        refused: Video path -> why DALI's reader (NVDEC, or DALI's CPU decoder) cannot take it,
            for ``gpufeed check``; such a video needs PyAV.
    """

    source: str
    reason: str
    refused: dict[str, str]

    def __iter__(self):  # ``source, reason = choose_decoder(...)`` unpacks as before
        return iter((self.source, self.reason))


def _reader_problem(info) -> str | None:
    """Why DALI's reader, on any device, would not read this video's frames as PyAV does (``None``: it would)."""
    if info.orientation:
        # DALI's video decoders return the stored frames; PyAV's are turned as shown.
        return (
            f"its display matrix shows the frames {info.orientation.describe()}: DALI's video decoders "
            "return the stored frames, PyAV turns them as shown"
        )
    if info.hidden_frames:
        return (
            f"an edit list hides its first {info.hidden_frames} decoded frame(s) (trimmed without "
            "re-encoding): DALI's reader counts them as frames, PyAV and players do not"
        )
    matrix = getattr(info, "colour_matrix", "")
    if matrix not in _BT601_MATRICES:
        name = _MATRIX_WORDS.get(matrix, matrix)
        return (
            f"its colour matrix is {name}: DALI's video readers convert with BT.601 (colours off by up to "
            f"~20 levels), PyAV with {name}"
        )
    if getattr(info, "interlaced", False):
        # DALI's GPU reader (frames_decoder_gpu.cc, read, not run) maps and converts the surface in its
        # decode callback, once a picture: an h264 field pair (PAFF) is two pictures, so a frame can
        # be handed over, or buffered, with one field decoded. MBAFF frames and HEVC's field pictures
        # (each one a frame here, for PyAV too) are whole pictures and may read right, but no GPU has
        # read one here, so all go to PyAV. VP8, VP9 and AV1 have no field coding; an interlaced MJPEG
        # (two JPEG fields a packet) reaches DALI's CPU reader only, untested on it: one rule for all.
        return (
            "it is interlaced (field-coded): DALI's GPU reader converts each field picture as it decodes it, "
            "so may return a frame with one field decoded; PyAV returns whole frames"
        )
    if info.container == "mpegts":
        return (
            "an MPEG transport stream: it has no index and FFmpeg's seeks in it can land a GOP late; "
            "PyAV's reads step back, DALI's reader does not"
        )
    if info.video_streams + info.still_pictures > 1:
        # DALI asks FFmpeg for the best stream before reading any packets, when a cover picture and
        # a video both have no frames counted yet: it may pick another stream, or the cover.
        streams = f"{info.video_streams} video streams" if info.video_streams > 1 else "a video stream"
        if info.still_pictures:
            streams += f" and {info.still_pictures} cover picture(s)"
            other = "another stream or the cover picture"
        else:
            other = "another"
        return (
            f"{streams}: gpufeed reads FFmpeg's best ({info.codec} {info.width}x{info.height}) with PyAV, "
            f"where DALI's reader might take {other}"
        )
    return None


def _refusals(infos, on_gpu: bool, capability) -> dict[str, str]:
    """Video path -> why DALI's reader cannot take it, for the videos it cannot."""
    refused = {}
    for info in infos:
        why = _reader_problem(info)
        if why is None and on_gpu:
            why = nvdec_problem(info, capability)
        elif why is None and info.codec not in DALI_CPU_CODECS:
            why = f"no GPU and DALI's CPU decoder lacks {info.codec}"
        if why:
            refused[info.path] = why
    return refused


def choose_decoder(requested: str, on_gpu: bool, infos, capability: tuple[int, int] | None = None) -> DecoderChoice:
    """Pick ``"dali"`` or ``"pyav"`` for ``video.decoder`` over the videos ``infos`` and say why.

    The encoded videos' half of :func:`gpufeed.pipelines._clip_sources.choose_clip_source`, which
    turns the name into the clip source.

    Args:
        requested: ``auto``, ``dali`` or ``pyav``.
        on_gpu: Whether the loader runs on a GPU (NVDEC) or the CPU.
        infos: The :class:`VideoInfo` of every video the loader reads.
        capability: The GPU's compute capability (see :func:`nvdec_problem`).

    Raises:
        ValueError: ``requested`` is not one of the three.
        DatasetError: ``dali`` was asked for and some video cannot be decoded by it (named, with why).
    """
    if requested not in ("auto", "dali", "pyav"):
        raise ValueError(f"decoder {requested!r} is not allowed; allowed: auto, dali, pyav")
    infos = list(infos)
    refused = _refusals(infos, on_gpu, capability)
    if requested == "pyav":
        return DecoderChoice("pyav", "video.decoder: pyav", refused)
    codecs = ", ".join(sorted({info.codec for info in infos}))
    if not refused:
        what = "NVDEC decodes" if on_gpu else "DALI's CPU decoder handles"
        return DecoderChoice("dali", f"video.decoder: {requested}; {what} every video ({codecs})", refused)
    first_path, first_why = next(iter(refused.items()))
    # "NVDEC cannot decode" only where every refusal is NVDEC's (a codec, profile, format or size).
    codecs_only = on_gpu and not any(_reader_problem(info) or info.codec in _GPU_READER_LACKS for info in infos)
    cannot = "NVDEC cannot decode" if codecs_only else "DALI's reader cannot take"
    lacking = ", ".join(sorted({info.codec for info in infos} - set(DALI_CPU_CODECS)))
    if requested == "dali":
        if not on_gpu and lacking:
            raise DatasetError(
                f"video.decoder: dali cannot decode {lacking} without a GPU (DALI's CPU decoder "
                f"handles {', '.join(DALI_CPU_CODECS)}); use decoder auto or pyav, or re-encode with "
                "'gpufeed prepare --codec vp9'"
            )
        raise DatasetError(
            f"video.decoder: dali, but {cannot} {len(refused)} video(s), "
            f"e.g. {first_path}: {first_why}; use decoder auto or pyav, or re-encode them with "
            "'gpufeed prepare' (h264 yuv420p BT.601, upright, progressive)"
        )
    if on_gpu:
        reason = (
            f"video.decoder: auto; {cannot} {len(refused)} of {len(infos)} video(s) (e.g. {first_path}: "
            f"{first_why}), so every clip decodes with PyAV; 'gpufeed prepare' re-encodes them for NVDEC"
        )
    elif lacking:
        reason = f"video.decoder: auto; no GPU and {lacking} needs PyAV keyframe seeks"
    else:
        reason = f"video.decoder: auto; {first_path}: {first_why}"
    return DecoderChoice("pyav", reason, refused)
