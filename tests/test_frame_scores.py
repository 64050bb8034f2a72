"""The scoring path: windows over a video's frames and the rule that gives each frame its probabilities.

Exact on tagged videos: the frames come through the sequential reader, a "model" reads their tags
(tests/predicthelp.py), and every frame's probabilities must equal the rule computed the slow way.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from predicthelp import CPU, TagModel, expected_frames, window_logits
from videohelp import encode_tagged_video

from gpufeed.config import SizePx
from gpufeed.models import WindowPlan, WindowScorer, score_frames
from gpufeed.models._heads import sigmoid
from gpufeed.pipelines import VideoFrameReader

pytestmark = pytest.mark.timeout(300)


def _chunks(num_frames: int, chunk: int):
    """Frames whose every pixel is the frame's index (mod 256) in int64, so a window's frames are readable."""
    for first in range(0, num_frames, chunk):
        count = min(chunk, num_frames - first)
        frames = torch.arange(first, first + count, dtype=torch.int64).view(count, 1, 1, 1).expand(count, 3, 2, 2)
        yield SimpleNamespace(frames=frames.contiguous(), frame_indices=torch.arange(first, first + count))


def _first_frames(clips: torch.Tensor) -> np.ndarray:
    """Logits of :func:`window_logits` from each window's first frame (the chunks above carry the index)."""
    return window_logits(clips[:, 0, 0, 0, 0].numpy())


@pytest.mark.parametrize(
    ("length", "stride", "hop", "frames", "expected"),
    [
        (5, 1, 1, 9, [0, 1, 2, 3, 4]),
        (5, 1, 5, 12, [0, 5, 7]),  # the last window ends at the last frame
        (5, 2, 3, 20, [0, 3, 6, 9, 11]),  # span 9
        (5, 1, 5, 10, [0, 5]),  # the tiling lands on the end: no extra window
        (11, 1, 1, 4, [0]),  # shorter than a window: one window, from frame 0
    ],
)
def test_window_starts(length, stride, hop, frames, expected):
    plan = WindowPlan(length, stride, hop)
    assert plan.starts(frames).tolist() == expected
    assert plan.window_count(frames) == len(expected)
    assert [plan.start_of(k, frames) for k in range(len(expected))] == expected
    assert (plan.coverage(frames) >= 1).all(), "every frame is covered by a window"


def test_a_short_video_repeats_its_last_frame():
    assert WindowPlan(5, 2).frames_of(0, 4).tolist() == [0, 2, 3, 3, 3]


def test_a_hop_past_the_span_is_refused_naming_the_range():
    with pytest.raises(ValueError, match=r"hop_frames 10 leaves frames no window covers: it must be 1\.\.9"):
        WindowPlan(5, 2, 10)
    with pytest.raises(ValueError, match="clip_length_frames 0 must be an integer >= 1"):
        WindowPlan(0)


@pytest.mark.parametrize(
    ("length", "stride", "hop", "frames", "chunk", "batch"),
    [
        (5, 1, 1, 40, 7, 3),
        (5, 2, 3, 41, 64, 4),
        (4, 1, 4, 41, 1, 1),
        (11, 1, 11, 100, 13, 8),
        (11, 1, 1, 3, 2, 2),
        (3, 3, 7, 50, 5, 16),
    ],
)
def test_every_frame_gets_the_mean_over_its_windows(length, stride, hop, frames, chunk, batch):
    plan = WindowPlan(length, stride, hop)
    blocks = list(score_frames(_chunks(frames, chunk), frames, plan, _first_frames, sigmoid, batch))
    firsts = [b.first_frame for b in blocks]
    assert firsts == np.cumsum([0] + [len(b) for b in blocks])[:-1].tolist(), "blocks follow each other"
    got = np.concatenate([b.probabilities for b in blocks])
    np.testing.assert_array_equal(got, expected_frames(plan, frames))
    # logits are joined by the same rule
    starts = plan.starts(frames)
    logits = window_logits(starts).astype(np.float64)
    want = np.stack(
        [logits[(starts <= i) & (i < np.minimum(starts + plan.span_frames, frames))].mean(0) for i in range(frames)]
    )
    np.testing.assert_array_equal(np.concatenate([b.logits for b in blocks]), want.astype(np.float32))


def test_windows_hold_the_right_frames_for_any_chunking():
    """Each window's frames, whatever the chunk and batch sizes: s, s + d, ... clamped to the last frame."""
    plan = WindowPlan(4, 3, 2)
    for chunk, batch in ((1, 1), (5, 2), (100, 7)):
        scorer = WindowScorer(plan, 30, batch, sigmoid)
        batches = []
        for part in _chunks(30, chunk):
            batches += scorer.add_frames(part.frames, int(part.frame_indices[0]))
        batches += scorer.finish()
        for b in batches:
            for start, clip in zip(b.starts, b.clips, strict=True):
                assert clip[0, :, 0, 0].tolist() == plan.frames_of(int(start), 30).tolist()
        assert np.concatenate([b.starts for b in batches]).tolist() == plan.starts(30).tolist()


def _halve(logits: np.ndarray) -> np.ndarray:
    """A head's rule that keeps the logits' range (sigmoid would flatten +-2**40 to 0 and 1)."""
    return (logits * np.float32(0.5)).astype(np.float32)


def _reference_scores(length, stride, hop, frames, logits_by_start):
    """The module docs' rule written out window by window, frame by frame, without WindowPlan: the
    windows' starts and frames, and each frame's float64 sums added in start order, then the mean."""
    span = (length - 1) * stride + 1
    last_start = max(0, frames - span)
    starts = list(range(0, last_start + 1, hop))
    if starts[-1] != last_start:
        starts.append(last_start)
    reads = [[min(s + t * stride, frames - 1) for t in range(length)] for s in starts]
    classes = logits_by_start.shape[1]
    sums, counts = np.zeros((frames, 2, classes)), np.zeros(frames, dtype=np.int64)
    for s in starts:
        row = np.stack([_halve(logits_by_start[s]), logits_by_start[s]]).astype(np.float64)
        for i in range(s, min(s + span, frames)):
            sums[i] += row
            counts[i] += 1
    means = (sums / counts[:, None, None]).astype(np.float32)
    return starts, reads, means[:, 0], means[:, 1]


def test_random_plans_match_the_rule_written_out():
    """Random plans, chunkings and batch sizes with logits whose float64 sums round (so the order of the
    additions shows): every window's start and frames, every frame's values, bit for bit."""
    rng = np.random.default_rng(33)
    for _ in range(60):
        length, stride = int(rng.integers(1, 7)), int(rng.integers(1, 4))
        span = (length - 1) * stride + 1
        hop, frames = int(rng.integers(1, span + 1)), int(rng.integers(1, 70))
        chunk, batch, classes = int(rng.integers(1, 25)), int(rng.integers(1, 9)), int(rng.integers(1, 5))
        # Logits +-2**40 or about 1: in float64, 2**40 + x - 2**40 rounds x where x + 2**40 - 2**40 does
        # not, so adding a frame's windows in another order changes its value.
        big = rng.choice([-(2.0**40), 0.0, 2.0**40], (frames, classes))
        logits_by_start = (big + rng.normal(0.0, 3.0, (frames, classes))).astype(np.float32)
        starts, reads, probabilities, logits = _reference_scores(length, stride, hop, frames, logits_by_start)
        clips_seen = []

        def score(clips, table=logits_by_start, seen=clips_seen):
            seen.append(clips[:, 0, :, 0, 0].numpy())  # (N, T): the frame indices each window read
            return table[clips[:, 0, 0, 0, 0].numpy()]

        plan = WindowPlan(length, stride, hop)
        blocks = list(score_frames(_chunks(frames, chunk), frames, plan, score, _halve, batch, keep_windows=True))
        case = f"T={length} d={stride} hop={hop} frames={frames} chunk={chunk} batch={batch}"
        assert np.concatenate([b.window_starts for b in blocks]).tolist() == starts, case
        assert np.concatenate(clips_seen).tolist() == reads, case
        assert [len(c) for c in clips_seen[:-1]] == [batch] * (len(clips_seen) - 1), case
        assert 1 <= len(clips_seen[-1]) <= batch, case
        np.testing.assert_array_equal(np.concatenate([b.probabilities for b in blocks]), probabilities, err_msg=case)
        np.testing.assert_array_equal(np.concatenate([b.logits for b in blocks]), logits, err_msg=case)


def test_memory_stays_bounded_over_a_long_video():
    """A 200,000-frame stream: the frames held and the sums kept never exceed the bound, whatever the length."""
    plan, batch, chunk, frames = WindowPlan(11, 1, 1), 16, 64, 200_000
    scorer = WindowScorer(plan, frames, batch, sigmoid)
    bound = plan.span_frames + batch * plan.hop_frames + chunk
    held = sums = done = 0
    for part in _chunks(frames, chunk):
        for b in scorer.add_frames(part.frames, int(part.frame_indices[0])):
            block = scorer.add_scores(b, _first_frames(b.clips))
            done += len(block) if block is not None else 0
            sums = max(sums, len(scorer._sums))
        held = max(held, scorer.frames_held)
    for b in scorer.finish():
        block = scorer.add_scores(b, _first_frames(b.clips))
        done += len(block) if block is not None else 0
    assert done == frames and scorer.done
    assert held <= bound, f"{held} frames held; the bound is {bound}"
    assert sums <= plan.span_frames + batch * plan.hop_frames, f"{sums} frames' sums kept"


def test_scores_out_of_order_and_frames_out_of_order_are_refused():
    plan = WindowPlan(3)
    scorer = WindowScorer(plan, 10, 2, sigmoid)
    frames = next(_chunks(10, 10)).frames
    with pytest.raises(ValueError, match="frames arrived from frame 4; frame 0 was expected next"):
        scorer.add_frames(frames[:3], 4)
    batches = scorer.add_frames(frames, 0) + scorer.finish()
    with pytest.raises(ValueError, match="scores of batch 1 arrived; batch 0 was expected"):
        scorer.add_scores(batches[1], np.zeros((len(batches[1]), 3), np.float32))
    with pytest.raises(ValueError, match=r"2 windows got logits of shape \(3, 3\)"):
        scorer.add_scores(batches[0], np.zeros((3, 3), np.float32))


@pytest.mark.parametrize(("length", "stride", "hop", "chunk"), [(5, 1, 1, 16), (4, 2, 3, 500), (5, 1, 5, 7)])
def test_tagged_video_through_the_sequential_reader(tmp_path, length, stride, hop, chunk):
    """The real reader's frames: every window holds its own frames (the model checks the tags), every
    frame's probabilities are the rule's, the last frames included."""
    frames = 57
    path = tmp_path / "tagged.mp4"
    encode_tagged_video(path, 3, frames, options={"bf": "2", "g": "12"}, labels=False)
    reader = VideoFrameReader(path, size_px=SizePx(40, 40), chunk_frames=chunk, device=CPU, decoder="pyav")
    model = TagModel(frames, stride, video_id=3)
    plan = WindowPlan(length, stride, hop)

    def score(clips):
        return model(clips).numpy()

    blocks = list(score_frames(reader, frames, plan, score, sigmoid, 4, keep_windows=True))
    np.testing.assert_array_equal(np.concatenate([b.probabilities for b in blocks]), expected_frames(plan, frames))
    assert [s for _, s in model.windows_seen] == plan.starts(frames).tolist(), "each window scored once, in order"
    starts = np.concatenate([b.window_starts for b in blocks])
    assert starts.tolist() == plan.starts(frames).tolist()
    windows = np.concatenate([b.window_probabilities for b in blocks])
    np.testing.assert_array_equal(windows, sigmoid(window_logits(starts)))


@pytest.mark.gpu
def test_tagged_video_through_nvdec(tmp_path):
    """The GPU twin: NVDEC frames (CUDA tensors), windows cut on the device, the rule exact."""
    from gpufeed.device import DeviceChoice

    frames = 57
    path = tmp_path / "tagged.mp4"
    encode_tagged_video(path, 3, frames, options={"bf": "2", "g": "12"}, labels=False)
    gpu = DeviceChoice("gpu", 0, "test")
    reader = VideoFrameReader(path, size_px=SizePx(40, 40), chunk_frames=16, device=gpu, decoder="dali")
    model = TagModel(frames, 2, video_id=3)
    plan = WindowPlan(5, 2, 3)
    seen_devices = set()

    def score(clips):
        seen_devices.add(clips.device.type)
        return model(clips).numpy()

    blocks = list(score_frames(reader, frames, plan, score, sigmoid, 4))
    assert seen_devices == {"cuda"}, "windows are cut from the frames on the GPU"
    # exact: the model's logits come from the integer tags it reads, the same numbers whichever decoder
    np.testing.assert_array_equal(np.concatenate([b.probabilities for b in blocks]), expected_frames(plan, frames))


@pytest.mark.gpu
def test_cutting_windows_on_the_gpu_does_not_wait_for_it():
    """The window index goes to the device from pinned memory: a pageable copy waits for the queued work."""
    import torch

    from gpufeed.models import gather_clips

    frames = torch.arange(20 * 3 * 4 * 4, dtype=torch.float32, device="cuda").view(20, 3, 4, 4)
    index = np.arange(6)[:, None] + np.arange(0, 10, 2)  # 6 windows of 5 frames, stride 2
    torch.cuda._sleep(100_000_000)  # work queued ahead, as the model's previous batch would be
    torch.cuda.set_sync_debug_mode("error")
    try:
        clips = gather_clips(frames, index)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert clips.shape == (6, 3, 5, 4, 4)
    # exact: frames copied, not decoded: the same numbers picked two ways
    assert torch.equal(clips[:, 0, :, 0, 0].cpu(), frames[torch.from_numpy(index).cuda(), 0, 0, 0].cpu())
