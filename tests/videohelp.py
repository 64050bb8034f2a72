"""Helpers for the video tests: tagged videos in unusual encodings, and reading tags back."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from gpufeed.pipelines._orientation import UPRIGHT, Orientation
from gpufeed.synth import behaviour_labels, read_tag, render_frame
from gpufeed.synth._videos import write_label_csv


def encode_tagged_video(
    path: Path,
    video_id: int,
    num_frames: int,
    *,
    codec: str = "libx264",
    width: int = 96,
    height: int = 64,
    pix_fmt: str = "yuv420p",
    options: dict | None = None,
    durations_ms: tuple[int, ...] = (),
    audio: bool = False,
    labels: bool = True,
    label_seed: int | None = None,
    shown: Orientation = UPRIGHT,
) -> np.ndarray:
    """Encode a video whose every frame carries its :mod:`gpufeed.synth` tag (frame index, video id).

    Args:
        codec, width, height, pix_fmt, options: The encoder and its settings (``options`` are the
            encoder's own, e.g. x264's ``bf``).
        durations_ms: Cycle of frame durations for a variable-frame-rate video (empty: 30 fps CFR).
        audio: Also mux a silent AAC track as long as the video.
        labels: Write the per-frame label CSV beside the video.
        label_seed: Seed of the behaviour labels (default: ``video_id``).
        shown: A display matrix, as a phone writes one: the frames are rendered ``width`` x
            ``height`` as they are to be shown and stored turned back, so only a reader that applies
            the matrix reads their tags.

    Returns:
        The per-frame label rows.
    """
    import av  # the video extra's PyAV; only the video tests need it

    rows = behaviour_labels(num_frames, seed=video_id if label_seed is None else label_seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=Fraction(30, 1))
        stream.width, stream.height = shown.shown_size(width, height)  # shown_size is its own inverse
        stream.pix_fmt = pix_fmt
        if shown:
            stream.set_display_rotation(shown.degrees, hflip=shown.mirrored)
        if durations_ms:
            stream.codec_context.time_base = Fraction(1, 1000)
        stream.options = dict(options or {})
        sound = container.add_stream("aac", rate=16000) if audio else None
        t_ms = 0
        for index in range(num_frames):
            rgb = render_frame(index, video_id, rows[index], width, height)
            if shown:  # undo the mirror, then the turn
                rgb = np.ascontiguousarray(np.rot90(rgb[:, ::-1] if shown.mirrored else rgb, -shown.turns))
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            if durations_ms:
                frame.pts, frame.time_base = t_ms, Fraction(1, 1000)
                t_ms += durations_ms[index % len(durations_ms)]
            else:
                frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            mux_silence(container, sound, int(16000 * num_frames / 30))
    if labels:
        write_label_csv(path.with_suffix(".csv"), rows)
    return rows


def mux_silence(container, sound, samples: int) -> None:
    """Encode ``samples`` of mono silence into the AAC stream ``sound`` (16 kHz) and mux them."""
    import av

    for start in range(0, samples, 1024):
        chunk = np.zeros((1, min(1024, samples - start)), dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 16000, start
        for packet in sound.encode(frame):
            container.mux(packet)
    for packet in sound.encode():
        container.mux(packet)


def write_odd_video(
    path: Path,
    video_id: int,
    num_frames: int,
    *,
    codec: str = "libx264",
    gop: int = 30,
    durations_ms: tuple[int, ...] = (),
    audio: bool = False,
    labels: bool = True,
) -> np.ndarray:
    """A tagged 96x64 video with a fixed GOP of ``gop`` frames (near-lossless x264 by default).

    Args:
        durations_ms: Cycle of frame durations for a variable-frame-rate video (empty: 30 fps CFR).
        audio: Also mux a silent AAC track.
    """
    if codec == "libx264":
        options = {"crf": "16", "g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"}
    else:
        options = {"g": str(gop)}
    return encode_tagged_video(
        path, video_id, num_frames, codec=codec, options=options, durations_ms=durations_ms, audio=audio, labels=labels
    )


def frame_tags(frames, layout: str) -> list[tuple[int, int]]:
    """(frame index, video id) read from each frame of a clip (3, T, H, W) or a chunk (T, 3, H, W)."""
    if layout == "CTHW":
        frames = frames.permute(1, 0, 2, 3)
    return [(tag.ident, tag.aux) for tag in (read_tag(f, "CHW") for f in frames)]


def decode_all(path) -> list[np.ndarray]:
    """Every frame of a file, decoded from the start with PyAV (the reference), converted as gpufeed does."""
    import av

    from gpufeed.pipelines._frame_fit import FrameFitter

    to_rgb = FrameFitter()
    with av.open(str(path)) as container:
        return [to_rgb(f) for f in container.decode(container.streams.video[0])]


def write_tagged_store(
    path: Path,
    video_id: int,
    num_frames: int,
    *,
    ext: str = ".png",
    by: str = "vidio",
    width: int = 96,
    height: int = 64,
    labels: bool = True,
    label_seed: int | None = None,
) -> np.ndarray:
    """Store a tagged video as a frame folder (``path`` without suffix) or an HDF5 file (``.h5``).

    Args:
        ext: ``.png`` or ``.jpg``: how each frame is encoded.
        by: ``"vidio"``: DeepEthogram's own writers (``DirectoryWriter``, ``HDF5Writer``);
            ``"hand"``: Pillow and h5py, in the same layouts (HDF5 frames with their channels
            reversed, as OpenCV encodes vidio's RGB arrays).
        labels: Write ``<name>.csv`` beside it, as DeepEthogram does (pandas index column).

    Returns:
        The per-frame label rows (the same as :func:`encode_tagged_video` for the same ids).
    """
    rows = behaviour_labels(num_frames, seed=video_id if label_seed is None else label_seed)
    frames = [render_frame(i, video_id, rows[i], width, height) for i in range(num_frames)]
    path.parent.mkdir(parents=True, exist_ok=True)
    hdf5 = path.suffix in (".h5", ".hdf5")
    if by == "vidio":
        from vidio.write import DirectoryWriter, HDF5Writer  # DeepEthogram's writers (test extra)

        writer_type = HDF5Writer if hdf5 else DirectoryWriter
        with writer_type(str(path), codec=ext, asynchronous=False) as writer:
            for frame in frames:
                writer.write(frame)
    elif hdf5:
        import h5py

        with h5py.File(path, "w") as fh:
            data = fh.create_dataset("frame", (num_frames,), dtype=h5py.vlen_dtype(np.uint8))
            for i, frame in enumerate(frames):
                data[i] = np.frombuffer(_encode(frame[..., ::-1], ext), dtype=np.uint8)
    else:
        path.mkdir()
        for i, frame in enumerate(frames):
            (path / f"{i:09d}{ext}").write_bytes(_encode(frame, ext))
    if labels:
        write_deepethogram_csv(Path(str(path.with_suffix("")) + ".csv"), rows)
    return rows


def source_points(fit: str, out_size: tuple[int, int], src_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Source (x, y) of every output column and row of a clip resized to ``out_size`` (width, height)
    from frames of ``src_size``: the whole frame (``stretch``), or its central region of the output's
    aspect ratio (``centre_crop``, its left edge floored to a whole pixel as the loaders do)."""
    (width, height), (src_w, src_h) = out_size, src_size
    if fit == "stretch":
        x0, region_w = 0.0, src_w
    else:
        region_w = src_h * width / height
        x0 = np.floor((src_w - region_w) / 2)
    return x0 + (np.arange(width) + 0.5) * region_w / width, (np.arange(height) + 0.5) * src_h / height


def _encode(rgb: np.ndarray, ext: str) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb)).save(out, format="PNG" if ext == ".png" else "JPEG", quality=95)
    return out.getvalue()


def write_deepethogram_csv(path: Path, rows: np.ndarray) -> None:
    """A label CSV as DeepEthogram writes it (pandas ``to_csv``): an unnamed index column, then one per class."""
    from gpufeed.synth import BEHAVIOURS

    lines = ["," + ",".join(BEHAVIOURS)] + [f"{i}," + ",".join(str(int(v)) for v in row) for i, row in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def make_deepethogram_project(root: Path, form: str, frames: tuple[int, ...], *, by: str = "vidio") -> Path:
    """A DeepEthogram project as its GUI leaves it, each video stored as ``form``: mp4, folder or hdf5.

    ``project_config.yaml`` lists ``project.class_names``; ``DATA/<key>/`` holds the video (``<key>.mp4``,
    the frame folder ``<key>/`` or ``<key>.h5``), ``<key>_labels.csv`` and a ``record.yaml`` whose
    ``rgb``/``label`` entries have ``all`` and ``default`` as DeepEthogram's ``parse_subdir`` writes
    them. Video ``i`` is tagged with id ``i``; labels as :func:`encode_tagged_video`'s.
    """
    import yaml

    from gpufeed.synth import BEHAVIOURS

    data = root / "DATA"
    data.mkdir(parents=True)
    config = {"project": {"name": root.name, "class_names": list(BEHAVIOURS), "data_path": "DATA", "path": str(root)}}
    (root / "project_config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    for video_id, count in enumerate(frames):
        key = f"mouse{video_id:02d}"
        folder = data / key
        folder.mkdir()
        name = {"mp4": f"{key}.mp4", "folder": key, "hdf5": f"{key}.h5"}[form]
        if form == "mp4":
            rows = encode_tagged_video(folder / name, video_id, count, options={"crf": "12", "g": "15"}, labels=False)
        else:
            rows = write_tagged_store(folder / name, video_id, count, by=by, labels=False)
        write_deepethogram_csv(folder / f"{key}_labels.csv", rows)
        record = {
            "key": key,
            "rgb": {"all": [name], "default": name},
            "label": {"all": [f"{key}_labels.csv"], "default": f"{key}_labels.csv"},
            "flow": {"all": [], "default": []},
            "output": {"all": [], "default": []},
        }
        (folder / "record.yaml").write_text(yaml.safe_dump(record), encoding="utf-8")
    return root


def cpu_clip_loader(
    folder, size, clip_length_frames: int, *, train: bool, batch_size: int = 4, threads: int = 1, seed: int = 0
):
    """A :class:`~gpufeed.pipelines.ClipLoader` on the CPU over the videos of ``folder`` (size: a ``SizePx``)."""
    from gpufeed.config import LoaderConfig, VideoConfig
    from gpufeed.device import DeviceChoice
    from gpufeed.pipelines import ClipLoader, VideoDataset

    return ClipLoader(
        VideoDataset.from_folder(folder),
        train=train,
        video_cfg=VideoConfig(size_px=size, clip_length_frames=clip_length_frames),
        loader_cfg=LoaderConfig(batch_size=batch_size, num_threads=threads),
        device=DeviceChoice("cpu", None, "test"),
        seed=seed,
    )


def clip_loader_on(
    device, folder, size, clip_length_frames: int, *, train: bool, batch_size: int = 4, threads: int = 1, seed: int = 0
):
    """:func:`cpu_clip_loader` on ``device`` (a :class:`~gpufeed.device.DeviceChoice`): its GPU twins read the same clips."""
    from gpufeed.config import LoaderConfig, VideoConfig
    from gpufeed.pipelines import ClipLoader, VideoDataset

    return ClipLoader(
        VideoDataset.from_folder(folder),
        train=train,
        video_cfg=VideoConfig(size_px=size, clip_length_frames=clip_length_frames),
        loader_cfg=LoaderConfig(batch_size=batch_size, num_threads=threads),
        device=device,
        seed=seed,
    )
