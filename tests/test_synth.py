"""The embedded dataset: deterministic, and its pixels say exactly what each sample is."""

from __future__ import annotations

import csv
import hashlib

import numpy as np
import pytest
from PIL import Image

from gpufeed.synth import (
    BEHAVIOURS,
    CLASS_WORDS,
    IMAGE_SIZES,
    SynthSpec,
    TagError,
    draw_tag,
    photo_pixels,
    read_tag,
    write_synthetic_dataset,
)


def _digest(folder):
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".png", ".jpg", ".csv", ".txt")):
        h.update(path.relative_to(folder).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_same_spec_writes_the_same_bytes(tmp_path):
    spec = SynthSpec(num_classes=2, train_per_class=3, val_per_class=1, num_videos=0)
    a = write_synthetic_dataset(tmp_path / "a", spec, progress=False)
    b = write_synthetic_dataset(tmp_path / "b", spec, progress=False)
    assert _digest(a) == _digest(b)


def test_images_carry_their_sample_id_and_label(synth_dir):
    classes = (synth_dir / "images" / "classes.txt").read_text().split()
    for split in ("train", "val"):
        rows = [line.split() for line in (synth_dir / "images" / f"{split}.txt").read_text().splitlines()]
        assert rows, split
        sizes = set()
        for sample_id, (rel, label) in enumerate(rows):
            path = synth_dir / "images" / rel
            assert path.parent.name == classes[int(label)]
            pixels = np.asarray(Image.open(path).convert("RGB"))
            sizes.add(pixels.shape[:2])
            tag = read_tag(pixels)
            assert (tag.ident, tag.aux) == (sample_id, CLASS_WORDS[int(label)]), path
        assert len(sizes) == len(IMAGE_SIZES), "several image sizes"
    formats = {p.suffix for p in (synth_dir / "images").rglob("*.*") if p.suffix in (".jpg", ".png")}
    assert formats == {".jpg", ".png"}


def test_tags_detect_a_different_sample():
    img = draw_tag(np.zeros((64, 64, 3), np.uint8), 1234, 7)
    assert read_tag(img).ident == 1234
    img[40:, 40:] = draw_tag(np.zeros((64, 64, 3), np.uint8), 1235, 7)[40:, 40:]  # checksum block of another
    with pytest.raises(TagError, match="checksum"):
        read_tag(img)


def test_videos_are_h264_with_indexed_frames_and_multi_hot_labels(synth_dir):
    import av

    videos = sorted((synth_dir / "videos").glob("*.mp4"))
    assert len(videos) == SynthSpec().num_videos
    for video_id, path in enumerate(videos):
        with open(path.with_suffix(".csv"), newline="") as fh:
            rows = list(csv.reader(fh))
        assert rows[0] == ["frame", *BEHAVIOURS]
        labels = np.array([[int(v) for v in row[1:]] for row in rows[1:]])
        assert set(np.unique(labels)) <= {0, 1}
        assert np.array_equal(labels[:, 0], (labels[:, 1:].sum(1) == 0).astype(int)), "background iff nothing else"
        assert labels[:, 1:].any(), "some behaviour happens"
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264"
            assert stream.codec_context.pix_fmt == "yuv420p"
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        assert len(frames) == len(labels) == SynthSpec().video_frames[video_id]
        for index, frame in enumerate(frames):
            tag = read_tag(frame)
            assert (tag.ident, tag.aux) == (index, video_id)


@pytest.mark.parametrize(
    ("width", "height", "seed"), [(1, 1, 0), (7, 5, 1), (640, 480, 2), (641, 479, 3), (33, 300, 4)]
)
def test_photo_pixels_are_the_gradients_texture_and_noise_pixel_by_pixel(width, height, seed):
    """Every pixel, computed the plain way on full grids: the broadcast row and column must give the same bytes
    (the server band tests and ``gpufeed bench images`` encode these pictures)."""
    yy, xx = np.mgrid[0:height, 0:width]
    want = np.stack([xx * 255 // width, yy * 255 // height, (xx // 7 + yy // 5) % 256], -1).astype(np.int16)
    want += np.random.default_rng(seed).integers(-25, 25, want.shape, dtype=np.int16)
    np.testing.assert_array_equal(photo_pixels(width, height, seed), np.clip(want, 0, 255).astype(np.uint8))
