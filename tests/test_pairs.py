"""Paired datasets: pairing by relative path or list file, and every problem named with both files.

Also ``gpufeed check`` on pairs, and EXIF orientation applying to the RGB only (its maps, exact).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import DatasetError, DenseLoader, PairedDataset, check_path
from gpufeed.synth import render_pair, write_paired_split

W, H = 96, 72


def _split(tmp_path: Path, count: int = 4) -> Path:
    return write_paired_split(tmp_path / "split", count, W, H, seed=5)


def _loader(dataset, **loader) -> DenseLoader:
    return DenseLoader(
        dataset,
        train=False,
        image_cfg=ImagePipelineConfig(size_px=32, eval_crop_fraction=1.0),
        loader_cfg=LoaderConfig(batch_size=2, last_batch="partial", **loader),
        device=DeviceChoice("cpu", None, "test"),
        size=(H, H),  # the centre H x H square at its own size: output pixel == source pixel
    )


def test_pairs_by_relative_path_and_infers_the_task(tmp_path):
    root = _split(tmp_path)
    dataset = PairedDataset.from_root(root)
    assert dataset.kinds == ("depth", "mask") and dataset.task == "depth"
    assert dataset.map_bits == {"depth": 16, "mask": 8} and not dataset.problems
    assert [Path(p).name for p in dataset.maps["mask"]] == [f"{i:06d}.png" for i in range(4)]
    shutil.rmtree(root / "depth")
    assert PairedDataset.from_root(root).task == "segmentation"


def test_every_problem_names_both_files(tmp_path):
    root = _split(tmp_path, 6)
    (root / "depth" / "000000.png").unlink()  # missing partner
    Image.fromarray(render_pair(1, W, H, 5)[0]).save(root / "mask" / "000001.png")  # RGB, not one channel
    (root / "depth" / "000002.png").unlink()
    Image.fromarray(np.zeros((H, W), np.uint8)).save(root / "depth" / "000002.jpg")  # not a PNG
    Image.fromarray(np.full((H, W), 7, np.uint8)).save(root / "depth" / "000003.png")  # 8-bit among 16-bit
    data = (root / "mask" / "000004.png").read_bytes()
    (root / "mask" / "000004.png").write_bytes(data[: len(data) // 2])  # truncated
    Image.fromarray(np.zeros((H, W), np.uint8)).save(root / "mask" / "extra.png")  # no RGB partner
    dataset = PairedDataset.from_root(root)
    problems = dataset.problems
    assert sorted(problems) == [0, 1, 2, 3, 4]
    rgb = [str(root / "rgb" / f"{i:06d}.jpg") for i in range(6)]
    assert "missing partner" in problems[0] and rgb[0] in problems[0] and "depth/000000.png" in problems[0]
    assert "8-bit RGB PNG" in problems[1] and "single-channel" in problems[1] and rgb[1] in problems[1]
    assert "must be PNG" in problems[2] and "000002.jpg" in problems[2] and rgb[2] in problems[2]
    assert "8-bit" in problems[3] and "16-bit" in problems[3] and "same bit depth" in problems[3]
    assert "truncated PNG" in problems[4] and "mask/000004.png" in problems[4] and rgb[4] in problems[4]
    assert len(dataset.orphans) == 1 and "extra.png" in dataset.orphans[0]
    # The loader refuses naming them, or leaves exactly those pairs out.
    with pytest.raises(DatasetError, match="5 pair"):
        _loader(dataset)
    loader = _loader(dataset, on_bad_sample="skip")
    assert [i for b in loader for i in b.sample_ids.tolist()] == [5]
    # gpufeed check reports each, plus the orphan, and fails.
    report = check_path(root, progress=False)
    assert not report.ok
    reasons = "\n".join(f"{f.path}: {f.reason}" for f in report.findings)
    for i in range(5):
        assert rgb[i] in reasons
    assert "extra.png: mask map with no RGB partner" in reasons


def test_check_finds_a_map_whose_data_fails_to_decode(tmp_path):
    root = _split(tmp_path, 2)
    path = root / "depth" / "000001.png"
    _damage_png_data(path)
    assert not PairedDataset.from_root(root).problems  # the structure is whole: only a decode finds it
    report = check_path(root, progress=False)
    assert [f.path for f in report.findings] == [str(root / "rgb" / "000001.jpg")]
    assert str(path) in report.findings[0].reason and "cannot be decoded" in report.findings[0].reason


def test_list_file_pairs_and_its_errors(tmp_path):
    root = _split(tmp_path, 3)
    lines = [f"rgb/{i:06d}.jpg depth/{i:06d}.png mask/{i:06d}.png" for i in range(3)]
    (root / "pairs.txt").write_text("# rgb depth mask\n" + "\n".join(lines) + "\n")
    dataset = PairedDataset.from_list(root / "pairs.txt")
    assert dataset.kinds == ("depth", "mask") and len(dataset) == 3 and not dataset.problems
    assert dataset.maps["depth"][2] == str(root / "depth" / "000002.png")
    (root / "short.txt").write_text(lines[0] + "\nrgb/000001.jpg depth/000001.png\n")
    with pytest.raises(DatasetError, match=r"short\.txt:2: .*\['depth'\].*\['depth', 'mask'\]"):
        PairedDataset.from_list(root / "short.txt")
    (root / "odd.txt").write_text("rgb/000000.jpg maps/000000.png\n")
    with pytest.raises(DatasetError, match=r"odd\.txt:1: cannot tell the kind of map .*data\.map_kinds"):
        PairedDataset.from_list(root / "odd.txt")
    named = PairedDataset.from_list(root / "odd.txt", map_kinds=("mask",))
    assert named.kinds == ("mask",) and "maps/000000.png" in named.problems[0]  # the file does not exist


def test_exif_orientation_applies_to_the_rgb_only(tmp_path):
    root = _split(tmp_path, 2)
    rgb, depth, mask = render_pair(0, W, H, 5)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display": store the displayed image turned back
    Image.fromarray(np.ascontiguousarray(np.rot90(rgb, k=1))).save(root / "rgb" / "000000.jpg", quality=95, exif=exif)
    dataset = PairedDataset.from_root(root)
    assert not dataset.problems and tuple(dataset.sizes[0]) == (W, H)  # oriented size == the maps' size
    batch = next(iter(_loader(dataset)))
    x0 = (W - H) // 2
    np.testing.assert_array_equal(batch.maps["depth"][0].numpy(), depth[:, x0 : x0 + H].astype(np.int32))
    np.testing.assert_array_equal(batch.maps["mask"][0].numpy(), mask[:, x0 : x0 + H])
    red = batch.images[0, 0].numpy().astype(np.int64)
    assert np.median(np.abs(red - rgb[:, x0 : x0 + H, 0])) <= 6  # the RGB came out upright, aligned with its maps
    # A map stored at the RGB's *stored* (unrotated) size is a mismatch naming both files.
    Image.fromarray(np.ascontiguousarray(np.rot90(mask, k=1))).save(root / "mask" / "000000.png")
    why = PairedDataset.from_root(root).problems[0]
    assert "size mismatch" in why and f"is {H}x{W}" in why and f"is {W}x{H}" in why and "000000.jpg" in why


def test_synth_writes_paired_splits_that_check_clean(tmp_path):
    from gpufeed.synth import SynthSpec, write_synthetic_dataset

    spec = SynthSpec(num_classes=1, train_per_class=1, val_per_class=1, num_videos=0, paired_train=3, paired_val=2)
    out = write_synthetic_dataset(tmp_path / "synth", spec, progress=False)
    train = PairedDataset.from_root(out / "dense" / "train")
    assert len(train) == 3 and len(PairedDataset.from_root(out / "dense" / "val")) == 2
    depth = np.asarray(Image.open(train.maps["depth"][1]))
    assert depth.dtype == np.uint16 and depth[10, 20] == 1 + 10 * 96 + 20 and depth[0, 0] == 0  # no-data block
    report = check_path(out, progress=False)
    assert report.ok and any("paired folders" in s for s in report.sources)


def test_gpufeed_check_names_a_bad_pair_and_fails(tmp_path, capsys):
    from gpufeed.cli import main

    root = _split(tmp_path, 2)
    (root / "mask" / "000001.png").unlink()
    assert main(["check", str(root)]) == 1
    out = capsys.readouterr().out
    assert "missing partner: no mask map for" in out and str(root / "rgb" / "000001.jpg") in out


def _damage_png_data(path: Path) -> None:
    """Garble a PNG's compressed data and fix its CRC: whole by structure, fails only a real decode."""
    import struct
    import zlib

    data = bytearray(path.read_bytes())
    idat = data.index(b"IDAT")
    data[idat + 8 : idat + 40] = bytes(32)
    length = struct.unpack(">I", data[idat - 4 : idat])[0]
    data[idat + 4 + length : idat + 8 + length] = struct.pack(">I", zlib.crc32(bytes(data[idat : idat + 4 + length])))
    path.write_bytes(bytes(data))


def test_a_map_that_fails_in_the_pipeline_costs_only_its_own_pair(tmp_path):
    root = _split(tmp_path, 6)
    _damage_png_data(root / "depth" / "000003.png")
    dataset = PairedDataset.from_root(root)
    assert not dataset.problems  # only decoding finds it
    loader = _loader(dataset, on_bad_sample="skip")
    seen = [i for b in loader for i in b.sample_ids.tolist()]
    assert sorted(seen) == [0, 1, 2, 4, 5]
    assert list(loader.skipped) == [3] and "depth/000003.png" in loader.skipped[3]
    with pytest.raises(Exception, match=r"000003"):
        list(_loader(dataset))
