"""What one DALI clip reader costs, bounded and logged (issue 25, item 2): decoders, memory, resize.

DALI's reader constructs a decoder per file-list line while building, so a list is capped at
``LIST_LINES`` lines even inside an epoch; these tests shrink the cap and read VP9 clips through
DALI's CPU reader (the same reader NVDEC runs on a GPU), checking every frame by its tag across
the rebuilds the cap causes. The figures of :mod:`gpufeed.pipelines._nvdec_reader` are checked on
index entries of known sizes; the ``gpu`` tests read through NVDEC with the cap and, where the
installed DALI has ``fn.experimental.readers.video_resize``, compare it pixel for pixel with the
separate resize.
"""

from __future__ import annotations

import gc
import logging
import weakref

import numpy as np
import pytest
from videohelp import frame_tags

from gpufeed.config import LoaderConfig, SizePx, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, PrepareOptions, VideoDataset, _clip_pipeline, prepare_videos
from gpufeed.pipelines._nvdec_reader import (
    DECODE_SURFACES,
    WARN_FORMATS,
    ReaderBuild,
    decoder_opens,
    fused_reader_resize,
    log_reader_build,
    nvdec_formats,
    reader_budget,
)
from gpufeed.pipelines._sampler import PlanStream
from gpufeed.pipelines._videos import VideoInfo

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
GPU = DeviceChoice("gpu", 0, "test")


@pytest.fixture(scope="module")
def vp9_dir(synth_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("vp9reader") / "videos"
    report = prepare_videos(synth_dir / "videos", out, PrepareOptions(codec="vp9", gop_frames=30, probe_clips=0), False)
    assert report.ok, report.table()
    return out


def _clips(dataset, device, *, batch=4, seed=0, fit="stretch", train=True, decoder="dali"):
    return ClipLoader(
        dataset,
        train=train,
        video_cfg=VideoConfig(clip_length_frames=11, stride_frames=2, size_px=32, fit=fit, decoder=decoder),
        loader_cfg=LoaderConfig(batch_size=batch, num_threads=2, last_batch="partial"),
        device=device,
        seed=seed,
    )


def _exact(batch, dataset):
    clips = []
    for k in range(len(batch)):
        video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
        frames = start + np.arange(11) * 2
        assert frame_tags(batch.clips[k], "CTHW") == [(int(f), video) for f in frames], "exactly the named frames"
        clips.append((video, start))
    return clips


def test_a_list_stops_inside_an_epoch_too_long_for_the_line_cap(vp9_dir, monkeypatch):
    dataset = VideoDataset.from_folder(vp9_dir)
    loader = _clips(dataset, CPU, batch=4)
    stream = PlanStream(loader._spec(), 0, 0)
    epoch_batches = stream.iterations_until(1)
    assert epoch_batches > 3, "the synthetic epoch spans several batches"
    assert _clip_pipeline.list_iterations(stream, 4) == (stream.iterations_until(_clip_pipeline.LIST_EPOCHS), False)
    assert _clip_pipeline.list_iterations(stream, 4, max_lines=8) == (2, True), "two batches of 4 lines"
    assert _clip_pipeline.list_iterations(stream, 4, max_lines=3) == (1, True), "never less than one batch"
    # Whole epochs while they fit: exactly the epochs within the cap, not a partial one after them.
    lines = 4 * stream.iterations_until(2) + 3
    assert _clip_pipeline.list_iterations(stream, 4, max_lines=lines) == (stream.iterations_until(2), False)


def test_a_capped_reader_reads_every_epoch_exactly_across_its_rebuilds(vp9_dir, monkeypatch, caplog):
    dataset = VideoDataset.from_folder(vp9_dir)
    reference = _clips(dataset, CPU, seed=3)
    expected = [list(zip(*(a.tolist() for a in reference.epoch_clips(e)), strict=True)) for e in range(2)]
    monkeypatch.setattr(_clip_pipeline, "LIST_LINES", 8)  # two batches of 4 per build
    caplog.set_level(logging.INFO, logger="gpufeed")
    loader = _clips(dataset, CPU, seed=3)
    got = [[c for batch in loader for c in _exact(batch, dataset)] for _ in range(2)]
    assert got == expected, "the same clips, in plan order, as one uncapped list"
    batches = [-(-len(epoch) // 4) for epoch in expected]
    assert loader.pipeline_builds == sum(-(-n // 2) for n in batches), "one build per two batches"
    capped = [r.getMessage() for r in caplog.records if "capped at 8 lines" in r.getMessage()]
    assert len(capped) == loader.pipeline_builds - sum(n % 2 for n in batches), capped
    assert capped[0].startswith(
        "DALI clip reader: a list of 8 clips for 2 batches (capped at 8 lines, inside the epoch"
    )
    assert "building it constructs 8 frame decoders (one per line)" in capped[0]


def test_every_reader_build_is_timed_and_logged_when_lists_are_capped(vp9_dir, monkeypatch, caplog):
    """What each build cost, list and DALI build apart: kept by the loader, logged when a list is capped."""
    dataset = VideoDataset.from_folder(vp9_dir)
    monkeypatch.setattr(_clip_pipeline, "LIST_LINES", 8)
    caplog.set_level(logging.INFO, logger="gpufeed")
    loader = _clips(dataset, CPU, seed=2)
    batches = sum(1 for _ in loader)
    builds = loader.reader_builds
    assert len(builds) == loader.pipeline_builds == -(-batches // 2) >= 3
    assert [b.lines for b in builds[:-1]] == [8] * (len(builds) - 1) and 0 < builds[-1].lines <= 8
    assert all(b.list_s > 0 and b.build_s > 0 and b.total_s == b.list_s + b.build_s for b in builds)
    timed = [r.getMessage() for r in caplog.records if " s for " in r.getMessage() and "clip reader" in r.getMessage()]
    assert len(timed) == len(builds), timed
    assert timed[0].startswith("DALI clip reader built in ") and "for 8 lines: list " in timed[0]
    assert timed[1].startswith("DALI clip reader rebuilt (build 2) in ") and ", DALI build " in timed[1]
    assert "the training thread waits through both" in timed[1]


def test_rebuilds_leave_one_live_pipeline_per_loader(vp9_dir, monkeypatch):
    """A replaced reader (its decoders, NVDEC sessions and full-size buffers) goes when the loader drops it."""
    dataset = VideoDataset.from_folder(vp9_dir)
    monkeypatch.setattr(_clip_pipeline, "LIST_LINES", 8)
    loader = _clips(dataset, CPU, seed=1)
    pipes = []
    for _ in loader:
        pipe = loader._session.iterator.pipe  # a CPU loader reads its pipeline through HostOutputs
        if not pipes or pipes[-1]() is not pipe:
            pipes.append(weakref.ref(pipe))
        del pipe
    assert len(pipes) == loader.pipeline_builds >= 3
    assert [ref() is not None for ref in pipes] == [False] * (len(pipes) - 1) + [True], "no collector pass needed"
    loader.close()
    gc.collect()
    assert pipes[-1]() is None


def _info(name, codec, width, height, pix_fmt="yuv420p"):
    return VideoInfo(path=name, codec=codec, width=width, height=height, num_frames=100, pix_fmt=pix_fmt)


def test_decoder_opens_count_file_changes_in_reader_order():
    assert decoder_opens([]) == 0
    assert decoder_opens([3, 3, 3]) == 1
    assert decoder_opens([0, 1, 0, 1]) == 4
    assert decoder_opens([0, 0, 1, 1]) == 2


def test_formats_memory_and_the_log_lines_of_a_reader():
    infos = [
        _info("a.mp4", "h264", 1920, 1080),
        _info("b.mp4", "h264", 1920, 1080),  # same format as a: one hardware decoder
        _info("c.mp4", "hevc", 1280, 720, "yuv420p10le"),
        _info("d.mp4", "h264", 640, 480),
    ]
    formats = nvdec_formats(infos)
    assert set(formats) == {
        ("h264", 1920, 1088, "420", 8),
        ("hevc", 1280, 720, "420", 10),
        ("h264", 640, 480, "420", 8),
    }
    assert formats[("h264", 1920, 1088, "420", 8)] == int(DECODE_SURFACES * 1920 * 1088 * 1.5)
    assert formats[("hevc", 1280, 720, "420", 10)] == int(DECODE_SURFACES * 1280 * 720 * 3)
    reader = np.array([0, 0, 1, 3, 0, 2, 2, 3])
    plan = np.array([0, 1, 0, 3, 2, 0, 3, 2])
    budget = reader_budget(
        infos, reader, plan, batch_size=4, clip_length_frames=16, capped=True, fused=False, fused_reason="why"
    )
    assert (budget.lines, budget.batches, budget.opens, budget.opens_plan_order) == (8, 2, 6, 8)
    assert budget.formats == 3 and budget.surface_bytes == sum(formats.values())
    assert budget.full_res_bytes == 2 * 4 * 16 * 1920 * 1080 * 3 and budget.largest == (1920, 1080)
    fused = reader_budget(
        infos, reader, plan, batch_size=4, clip_length_frames=16, capped=False, fused=True, fused_reason=""
    )
    assert fused.full_res_bytes == budget.full_res_bytes // 2, "no full-size output copy"
    decoders, memory = budget.lines_text()
    assert decoders == (
        "NVDEC clip reader: a list of 8 clips for 2 batches (capped at 8 lines, inside the epoch: a new pipeline "
        "continues after them); building it constructs 8 frame decoders (one per line), reading it 6 (one per file "
        "change; 8 in plan order)"
    )
    assert memory.startswith("NVDEC memory: 3 video format(s), so 3 hardware decoder(s) kept per GPU with about 0.")
    assert "full-resolution frames in flight about 0.74 GiB (clips up to 1920x1080); why" in memory
    assert not budget.warn and "gpufeed prepare" not in memory


def test_many_frame_sizes_warn_and_name_the_remedy():
    infos = [_info(f"{k}.mp4", "h264", 320 + 16 * k, 240) for k in range(WARN_FORMATS + 1)]
    budget = reader_budget(
        infos, np.arange(len(infos)), np.arange(len(infos)), batch_size=1, clip_length_frames=8, capped=False,
        fused=False, fused_reason="r",
    )  # fmt: skip
    assert budget.formats == WARN_FORMATS + 1 and budget.warn
    assert "re-encode the videos to fewer frame sizes ('gpufeed prepare')" in budget.lines_text()[1]


def test_a_slow_gpu_build_warns_with_its_cost_per_clip_and_the_pyav_comparison(caplog):
    """The H100's figures (6,912 lines in 56.7 s) warn; a CPU build of the same size, or a quick GPU one, does not."""
    with caplog.at_level(logging.INFO, logger="gpufeed"):
        log_reader_build(ReaderBuild(6912, False, 0.15, 56.7), 1, on_gpu=True)
        log_reader_build(ReaderBuild(6912, True, 0.15, 0.6), 1, on_gpu=False)
        log_reader_build(ReaderBuild(6912, False, 0.15, 6.9), 2, on_gpu=True)
    (slow, cpu, quick) = caplog.records
    assert slow.levelno == logging.WARNING and "8.2 ms a clip on the training thread" in slow.getMessage()
    assert "--decoder pyav" in slow.getMessage() and "video.decoder: pyav" in slow.getMessage()
    assert cpu.levelno == quick.levelno == logging.INFO and "pyav" not in quick.getMessage()


def test_the_cpu_reader_never_fuses_and_a_fused_cpu_pipeline_is_refused(tmp_path):
    from nvidia.dali import fn

    assert fused_reader_resize(False)[0] is False
    has_it = hasattr(fn.experimental.readers, "video_resize")
    fused, why = fused_reader_resize(True)
    assert fused is has_it
    if not has_it:
        import nvidia.dali as dali

        assert f"DALI {dali.__version__} has no resize inside fn.experimental.readers.video" in why
    with pytest.raises(ValueError, match="fused_resize is for the dali source on a GPU"):
        _clip_pipeline.build_clip_pipeline(
            clip_input=_clip_pipeline.ReaderInput(tmp_path / "none.txt", fused_resize=True), clip_length_frames=4,
            stride_frames=1, size_px=SizePx(32, 32), fit="stretch", batch_size=2, device_id=None, num_threads=1,
            prefetch_queue_depth=1, seed=0,
        )  # fmt: skip


@pytest.mark.gpu
def test_nvdec_reads_exactly_with_a_capped_list_and_logs_its_budget(synth_dir, monkeypatch, caplog):
    dataset = VideoDataset.from_folder(synth_dir / "videos")  # h264: NVDEC, and no DALI decoder on the CPU
    # The plan does not depend on the decoder: the CPU loader (PyAV under auto) is only asked for it.
    reference = _clips(dataset, CPU, seed=4, decoder="auto")
    expected = list(zip(*(a.tolist() for a in reference.epoch_clips(0)), strict=True))
    monkeypatch.setattr(_clip_pipeline, "LIST_LINES", 8)
    caplog.set_level(logging.INFO, logger="gpufeed")
    loader = _clips(dataset, GPU, seed=4, fit="centre_crop")
    assert loader.source == "dali"
    assert [c for batch in loader for c in _exact(batch, dataset)] == expected
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("NVDEC clip reader: a list of 8 clips for 2 batches (capped") for m in messages)
    assert any(m.startswith("NVDEC memory: 1 video format(s), so 1 hardware decoder(s)") for m in messages)
    # What each NVDEC build took, for this GPU's log: the figure no CPU run can give.
    assert any(m.startswith("NVDEC clip reader rebuilt (build 2) in ") for m in messages)
    assert len(loader.reader_builds) == loader.pipeline_builds >= 2


@pytest.mark.gpu
def test_the_fused_reader_resize_matches_the_separate_resize(synth_dir, monkeypatch):
    """The same clips, exactly their frames, either way; pixels within a level (two resize implementations)."""
    from gpufeed.pipelines import _clip_sources

    if not fused_reader_resize(True)[0]:
        pytest.skip(fused_reader_resize(True)[1])
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    runs = {}
    for fused in (True, False):
        # The reader's builder asks log_reader_budget whether to fuse (it says what it chose).
        monkeypatch.setattr(_clip_sources, "log_reader_budget", lambda *args, fused=fused: fused)
        loader = _clips(dataset, GPU, seed=6, fit="centre_crop", train=False)
        runs[fused] = [(_exact(batch, dataset), batch.clips.cpu().int()) for batch in loader]
        loader.close()
    for (clips_fused, fused_px), (clips_plain, plain_px) in zip(runs[True], runs[False], strict=True):
        assert clips_fused == clips_plain, "the same clips"
        diff = (fused_px - plain_px).abs()
        assert diff.float().mean() < 1.0 and diff.max() <= 8, (diff.float().mean(), diff.max())
