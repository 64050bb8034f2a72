"""Training reliability: corrupt images and a truncated video through check, error, skip and quarantine."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from gpufeed.config import LoaderConfig, describe_config
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import DatasetError, ImageDataset, ImageLoader
from gpufeed.pipelines._quarantine import read_quarantine
from gpufeed.reliability import run_bad_data

pytestmark = pytest.mark.process

CPU = DeviceChoice("cpu", None, "test")


@pytest.fixture(scope="module")
def report(synth_dir, tmp_path_factory):
    result = run_bad_data(tmp_path_factory.mktemp("bad-data"), data=synth_dir, progress=False)
    print(result.table())
    return result


@pytest.mark.timeout(300)
def test_check_lists_every_damaged_file_and_writes_the_quarantine_list(report):
    assert report.check_status == 1
    assert sorted(report.check_listed) == sorted(report.damaged), "exactly the damaged files, nothing else"
    reasons = report.check_listed
    video = report.dataset.videos[0]
    assert "truncated" in reasons[video]
    assert "cannot be decoded" in reasons[report.dataset.decode_only[0]], "only a full decode finds the PNG"
    assert report.quarantine_lines == sorted(report.damaged)
    assert all(os.path.isabs(p) for p in report.quarantine_lines)


def test_default_policy_stops_with_an_error_naming_the_files(report):
    bad = report.dataset
    image = report.case("image, default")
    assert image.status == 2 and image.steps == 0, "index-visible damage stops the run before its first step"
    assert image.named == sorted(bad.index_visible)
    assert "loader.quarantine_file" in image.error and "on_bad_sample: skip" in image.error

    decode = report.case("image, decode")
    assert decode.status == 2 and decode.named == list(bad.decode_only), "decode-time damage, at its batch"
    assert "bad sample in the pipeline" in decode.error

    clip = report.case("clip, default")
    assert clip.status == 2 and clip.steps == 0 and clip.named == list(bad.videos)
    assert "truncated" in clip.error


def test_skip_trains_to_the_end_and_reports_how_many_it_skipped(report):
    images = report.case("image, skip")
    assert images.status == 0 and images.steps > 0 and not images.error
    # 3 seen by the index before training, 1 found when its batch failed to decode
    assert images.skipped == images.metric == 4 and images.quarantined == 0
    assert images.summary_line.startswith("skipped: 4 training sample(s) (4 unusable")
    assert images.warned
    clips = report.case("clip, skip")
    assert clips.status == 0 and clips.skipped == clips.metric == 1 and clips.warned
    assert clips.summary_line.startswith("skipped: 1 training video(s)")


def test_quarantine_list_from_check_trains_clean_with_the_default_policy(report):
    for name, count in (("image, quarantine", 4), ("clip, quarantine", 1)):
        case = report.case(name)
        assert case.status == 0 and case.steps > 0, case.error
        assert case.skipped == case.quarantined == case.metric == count
    assert report.ok, report.table()


def test_quarantine_file_is_a_documented_config_key():
    rows = {row[0]: row for row in describe_config()}
    assert "gpufeed check --quarantine" in rows["loader.quarantine_file"][3]


def test_quarantine_file_format_relative_paths_comments_and_linked_folders(synth_dir, tmp_path):
    images = synth_dir / "images"
    lines = (images / "val.txt").read_text().split("\n")
    first, second = (images / lines[0].split()[0]), (images / lines[5].split()[0])
    linked = tmp_path / "linked"
    linked.symlink_to(images, target_is_directory=True)
    listing = tmp_path / "lists" / "quarantine.txt"
    listing.parent.mkdir()
    rel = os.path.relpath(first, listing.parent)
    listing.write_text(f"# left out after review\n\n{rel}\n{linked / second.relative_to(images)}\n")
    quarantine = read_quarantine(listing)
    dataset = ImageDataset.from_list(images / "val.txt")
    ids = quarantine.ids_in(dataset.paths)
    assert [dataset.paths[i] for i in ids] == sorted([str(first), str(second)], key=dataset.paths.index)

    cfg = LoaderConfig(batch_size=8, num_threads=1, quarantine_file=listing)
    loader = ImageLoader(dataset, train=False, image_cfg=_image_cfg(), loader_cfg=cfg, device=CPU)
    seen = [i for batch in loader for i in batch.sample_ids.tolist()]
    assert seen == [i for i in range(len(dataset)) if i not in ids], "exactly the listed files are left out"
    assert set(loader.skipped) == set(loader.quarantined) == set(ids)
    assert all(why.startswith("quarantined: listed in") for why in loader.skipped.values())


def test_a_quarantined_bad_file_is_not_an_error(synth_dir, tmp_path):
    root = tmp_path / "images"
    shutil.copytree(synth_dir / "images", root, ignore=shutil.ignore_patterns(".gpufeed"))
    victim = sorted((root / "val").rglob("*.jpg"))[0]
    victim.write_bytes(b"")
    dataset = ImageDataset.from_list(root / "val.txt")
    with pytest.raises(DatasetError, match="zero-byte"):
        ImageLoader(dataset, train=False, image_cfg=_image_cfg(), loader_cfg=LoaderConfig(batch_size=8), device=CPU)
    listing = tmp_path / "q.txt"
    listing.write_text(f"{victim}\n")
    loader = ImageLoader(
        dataset,
        train=False,
        image_cfg=_image_cfg(),
        loader_cfg=LoaderConfig(batch_size=8, quarantine_file=listing),
        device=CPU,
    )
    assert len(loader) == int(np.ceil((len(dataset) - 1) / 8))


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "does not exist; 'gpufeed check DATA --quarantine"),
        (b"\xff\xfe\x00junk", "is not UTF-8 text"),
        (
            b"checked 96 file(s)\n  [image] /data/a.jpg: zero-byte file\n",
            ":2: looks like a line of 'gpufeed check' output",
        ),
        (b"/data/a.jpg\n/data/b\x07.jpg\n", ":2: not a path (it holds a control character)"),
    ],
)
def test_quarantine_file_problems_are_named(tmp_path, content, words):
    listing = tmp_path / "q.txt"
    if content is not None:
        listing.write_bytes(content)
    with pytest.raises(DatasetError) as info:
        read_quarantine(listing)
    assert words in str(info.value) and str(listing) in str(info.value)


def _image_cfg():
    from gpufeed.config import ImagePipelineConfig

    return ImagePipelineConfig(size_px=32)
