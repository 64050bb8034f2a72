"""Runs of windows that share a stacked-frame model's first convolution: the rewritten graph and ``predict``'s use of it.

Real exports (``gpufeed export``'s own graph of ``clip_resnet18``), real onnxruntime sessions, real
video files: the rewritten graph answers what the plain graph answers for every window of a run,
at any frame stride and for a short (padded) run; a graph of another shape is refused with its
reason; ``predict`` scores runs and writes what it writes window by window; and a sliding graph
that disagrees with the plain one is caught on the first run and set aside.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from _serving import write_checkpoint
from predicthelp import CPU
from videohelp import encode_tagged_video

from gpufeed.cli import main
from gpufeed.models import ONNX_FILE, SlidingRunner, WindowPlan, WindowScorer, export_model
from gpufeed.models._sliding_stem import SlidingStemError, sliding_window_graph
from gpufeed.predict import load_predictor, predict_videos
from gpufeed.predict._outputs import read_predictions_csv

pytestmark = pytest.mark.timeout(600)

T = 5  # frames per window
SPEC = {"num_classes": 3, "size_px": 32, "clip_length_frames": T}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A stacked-frame clip model and a 3-D one, each a checkpoint and an export, and a video."""
    root = tmp_path_factory.mktemp("sliding")
    found = {}
    for name in ("clip_resnet18", "r3d_small"):
        checkpoint = write_checkpoint(root / f"run-{name}", name, seed=3, **SPEC)
        export_model(checkpoint, root / name, batch_size=4)
        found[name], found[f"{name}-checkpoint"] = root / name, checkpoint
        if name == "clip_resnet18":  # a graph fixed at one batch size: its flatten names the size
            export_model(checkpoint, root / "fixed", batch_sizes=[4])
            export_model(checkpoint, root / "pairs", batch_size=2)  # fewer than the warm-up check's windows
            found["fixed"], found["pairs"] = root / "fixed", root / "pairs"
    found["video"] = root / "videos" / "mouse.mp4"
    encode_tagged_video(found["video"], 1, 90, width=64, height=48, options={"bf": "2", "g": "12"}, labels=False)
    return found


def _plain_logits(folder: Path, clips: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(folder / ONNX_FILE), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"pixels": clips[i : i + 4]})[0] for i in range(0, len(clips), 4)])


def _clips(frames: np.ndarray, count: int, stride: int) -> np.ndarray:
    """Windows at frames 0 .. count - 1 as the plain graph takes them, (count, 3, T, H, W)."""
    index = np.arange(count)[:, None] + np.arange(T)[None, :] * stride
    return np.ascontiguousarray(frames[index].transpose(0, 2, 1, 3, 4))


@pytest.mark.parametrize("stride", [1, 3])
def test_the_rewritten_graph_answers_the_plain_graph_for_every_window(models, stride):
    graph, shape = sliding_window_graph(onnx.load(str(models["clip_resnet18"] / ONNX_FILE)), T, stride, 9)
    assert shape.windows == 9 and shape.span_frames == (T - 1) * stride + 1
    assert shape.block_frames == 9 + shape.span_frames - 1
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    frames = np.random.default_rng(stride).integers(0, 256, (shape.block_frames, 3, 32, 32), dtype=np.uint8)
    got = session.run(None, {"frames": frames})[0]
    want = _plain_logits(models["clip_resnet18"], _clips(frames, 9, stride))
    assert got.shape == want.shape == (9, 3)
    assert np.abs(want[1:] - want[:-1]).max() > 1e-3, "the windows' logits differ, so a shifted window would show"
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_graph_fixed_at_one_batch_size_runs_at_the_run_s_windows(models):
    runner = SlidingRunner(models["fixed"] / ONNX_FILE, T, 1, threads=1, windows=9)
    frames = np.random.default_rng(1).integers(0, 256, (13, 3, 32, 32), dtype=np.uint8)
    clips = _clips(frames, 9, 1)
    want = _plain_logits(models["fixed"], np.concatenate([clips, np.repeat(clips[-1:], 3, axis=0)]))[:9]
    np.testing.assert_allclose(runner(torch.from_numpy(frames)), want, rtol=0, atol=1e-5)


def test_a_short_run_is_padded_and_only_its_own_windows_come_back(models):
    runner = SlidingRunner(models["clip_resnet18"] / ONNX_FILE, T, 2, threads=1, windows=8)
    span = runner.shape.span_frames
    frames = np.random.default_rng(0).integers(0, 256, (span + 2, 3, 32, 32), dtype=np.uint8)
    got = runner(torch.from_numpy(frames))
    assert got.shape == (3, 3)
    np.testing.assert_allclose(got, _plain_logits(models["clip_resnet18"], _clips(frames, 3, 2)), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="holds 0 windows"):
        runner(torch.from_numpy(frames[: span - 1]))


def test_a_model_of_another_shape_is_refused_with_its_reason(models):
    with pytest.raises(SlidingStemError, match="after Add comes Conv, not Reshape"):
        sliding_window_graph(onnx.load(str(models["r3d_small"] / ONNX_FILE)), T, 1, 8)
    with pytest.raises(SlidingStemError, match=r"not \(batch, 3, 7, H, W\) clips"):
        sliding_window_graph(onnx.load(str(models["clip_resnet18"] / ONNX_FILE)), 7, 1, 8)


def test_the_scorer_hands_over_runs_of_the_held_frames_and_cuts_what_no_run_holds():
    frames = torch.arange(30, dtype=torch.uint8).view(30, 1, 1, 1).expand(30, 3, 2, 2).contiguous()
    plan = WindowPlan(T, 2, 1)  # span 9
    scorer = WindowScorer(plan, 30, 8, lambda x: x, runs=True)
    batches = scorer.add_frames(frames[:20]) + scorer.add_frames(frames[20:]) + scorer.finish()
    assert [b.starts.tolist() for b in batches] == [list(range(0, 8)), list(range(8, 16)), list(range(16, 22))]
    for batch in batches:
        assert batch.clips is None and batch.run is not None
        assert batch.run[:, 0, 0, 0].tolist() == list(range(int(batch.starts[0]), int(batch.starts[-1]) + 9))
    # A video shorter than a span: its one window repeats the last frame, which no run holds.
    short = WindowScorer(plan, 6, 8, lambda x: x, runs=True)
    (batch,) = short.add_frames(frames[:6]) + short.finish()
    assert batch.run is None and batch.clips is not None
    assert batch.clips[0, 0, :, 0, 0].tolist() == [0, 2, 4, 5, 5]


def _predict(predictor, video: Path, out: Path, hop: int = 1) -> np.ndarray:
    report = predict_videos(video, predictor, out=out, hop_frames=hop, progress=False)
    assert [r.status for r in report.results] == ["scored"], report.results
    return read_predictions_csv(out / f"{video.stem}_predictions.csv")[1]


@pytest.mark.parametrize("source", ["clip_resnet18", "clip_resnet18-checkpoint"])
def test_predict_scores_runs_and_writes_what_windows_one_by_one_write(models, tmp_path, caplog, source):
    caplog.set_level(logging.INFO, "gpufeed")
    runs = load_predictor(models[source], CPU, export_cache=tmp_path / "cache")
    one_by_one = load_predictor(models[source], CPU, export_cache=tmp_path / "cache", window_runs=False)
    assert runs.run_windows(1) > 0 and runs.run_windows(2) == 0 and one_by_one.run_windows(1) == 0
    assert "share the first convolution" in runs.describe()
    got, want = _predict(runs, models["video"], tmp_path / "a"), _predict(one_by_one, models["video"], tmp_path / "b")
    assert runs._runs_agree is True and "runs of windows agree with the plain graph" in caplog.text
    assert got.shape == (90, 3)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # A 3-D model has no first convolution to share: its windows go one by one, saying why.
    assert load_predictor(models["r3d_small"], CPU).run_windows(1) == 0
    assert "windows are scored one by one: after Add comes Conv" in caplog.text


def test_a_video_of_few_windows_goes_one_by_one(models, tmp_path):
    """A short run costs a whole run's work in the sliding graph: under 60 % of its windows go one by one."""
    video = tmp_path / "short.mp4"
    encode_tagged_video(video, 2, T + 6, width=64, height=48, labels=False)  # 7 windows of 32
    predictor = load_predictor(models["clip_resnet18"], CPU)
    assert predictor._sliding is not None and predictor._sliding.is_short(7) and not predictor._sliding.is_short(20)
    got = _predict(predictor, video, tmp_path / "a")
    assert predictor._runs_agree is None, "no run went through the sliding graph"
    want = _predict(load_predictor(models["clip_resnet18"], CPU, window_runs=False), video, tmp_path / "b")
    np.testing.assert_array_equal(got, want)


class _Shifted:
    """A sliding runner whose answers are off by one: what the first run's check must catch."""

    def __init__(self, runner: SlidingRunner) -> None:
        self.runner, self.shape, self.windows, self.owner = runner, runner.shape, runner.windows, runner.owner

    def windows_of(self, run, count):
        return self.runner.windows_of(run, count)

    # The real count and check, on these answers.
    count, is_short, first_run = SlidingRunner.count, SlidingRunner.is_short, SlidingRunner.first_run

    def __call__(self, run, alone=False):
        return self.runner(run, alone) + 1.0


def test_a_sliding_graph_that_disagrees_is_set_aside_on_the_first_run(models, tmp_path, caplog):
    predictor = load_predictor(models["clip_resnet18"], CPU)
    assert predictor._sliding is not None
    predictor._sliding = _Shifted(predictor._sliding)
    got = _predict(predictor, models["video"], tmp_path / "a")
    assert predictor._runs_agree is False and predictor.run_windows(1) == 0
    assert "its sliding-window graph disagrees with the plain one" in caplog.text
    want = _predict(load_predictor(models["clip_resnet18"], CPU, window_runs=False), models["video"], tmp_path / "b")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_the_command_scores_runs_and_no_window_runs_scores_every_window_alone(models, tmp_path, capsys):
    common = [str(models["clip_resnet18-checkpoint"]), str(models["video"]), "--export-cache", str(tmp_path / "c")]
    assert main(["predict", *common, "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    assert "runs of 32 share the first convolution" in capsys.readouterr().out
    assert main(["predict", *common, "--out", str(tmp_path / "alone"), "--quiet", "--no-window-runs"]) == 0
    assert "share the first convolution" not in capsys.readouterr().out
    runs, alone = (read_predictions_csv(tmp_path / d / "mouse_predictions.csv")[1] for d in ("runs", "alone"))
    np.testing.assert_allclose(runs, alone, rtol=0, atol=1e-6)


@pytest.mark.live
@pytest.mark.parametrize("runs", [True, False], ids=["runs", "one-by-one"])
def test_the_served_video_equals_predicts_runs(models, tmp_path, runs):
    """The server scores a posted video in runs of windows, as `predict` does; with serve.video_window_runs
    off, every window through its batcher. Both give `predict`'s numbers; the statistics show which ran."""
    import shutil

    import httpx

    from gpufeed.config import parse_config
    from gpufeed.server import start_server

    shutil.copytree(models["clip_resnet18"], tmp_path / "repo" / "stacked")
    predictor = load_predictor(tmp_path / "repo" / "stacked", CPU)
    want = _predict(predictor, models["video"], tmp_path / "out")
    assert predictor._runs_agree is True
    cfg = parse_config({"device": "cpu", "serve": {"video_window_runs": runs}})
    server = start_server(repo=tmp_path / "repo", cfg=cfg, port=0, device=CPU)
    try:
        answer = httpx.post(
            f"{server.url}/v1/models/stacked/predict",
            content=models["video"].read_bytes(),
            headers={"content-type": "video/mp4"},
            timeout=120,
        )
        stats = httpx.get(f"{server.url}/v2/models/stacked/stats", timeout=30).json()["model_stats"][0]
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    served = np.array(answer.json()["scores"], dtype=np.float32)
    assert served.shape == want.shape == (90, 3)
    assert np.abs(served - want).max() < 1e-5, "the served video and gpufeed predict agree"
    batches = {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats["batch_stats"]}
    assert stats["inference_count"] == 90 - T + 1, "each window counted once"
    # Runs of 32 windows, the last of 22 padded (not short: over 60 % full); else the card's batches of 4.
    assert batches == ({32: 2, 22: 1} if runs else {4: 21, 2: 1}), batches


@pytest.mark.parametrize("agree", [True, False], ids=["agrees", "disagrees"])
def test_a_served_models_runs_are_checked_at_warm_up(models, caplog, agree):
    """Before its first request, a served stacked-frame model's sliding graph must agree with its plain
    batches on a run of noise frames; one that does not is set aside, and its videos go window by window."""
    from gpufeed.config import parse_config
    from gpufeed.models import read_model_card
    from gpufeed.server._metrics import ServerMetrics
    from gpufeed.server._model import ServedModel

    caplog.set_level(logging.INFO, "gpufeed")
    folder = models["clip_resnet18"]
    card = read_model_card(folder)
    cfg = parse_config({"device": "cpu"}).serve
    model = ServedModel("stacked", folder, card, cfg, CPU, ServerMetrics({"stacked": card.batch_size}))
    try:
        assert model.video_runs is not None and model.video_runs.windows_for(2) == 0
        if not agree:
            model.video_runs.sliding = _Shifted(model.video_runs.sliding)
        model.warm_up()
        assert (model.video_runs is not None) is agree
        assert model.describe()["video_window_runs"] == (32 if agree else 0)
        said = "runs of windows agree" if agree else "its sliding-window graph disagrees with the plain one"
        assert said in caplog.text and "model stacked: " in caplog.text
    finally:
        model.close(drain=False)
    # serve.video_window_runs: false, and a 3-D model, have no runs at all.
    off = parse_config({"device": "cpu", "serve": {"video_window_runs": False}}).serve
    assert (
        ServedModel("stacked", folder, card, off, CPU, ServerMetrics({"stacked": card.batch_size})).video_runs is None
    )
    r3d = read_model_card(models["r3d_small"])
    metrics = ServerMetrics({"r3d": r3d.batch_size})
    assert ServedModel("r3d", models["r3d_small"], r3d, cfg, CPU, metrics).video_runs is None


def test_a_model_of_small_batches_checks_its_runs_in_them_and_a_run_keeps_plain_batches_to_their_share(models):
    """A model exported at batch size 2 checks its runs at warm-up in batches of 2 (the check has 4
    windows); while a run holds a lane, a plain batch takes the shared session, not every core."""
    from gpufeed.config import parse_config
    from gpufeed.models import read_model_card
    from gpufeed.server._metrics import ServerMetrics
    from gpufeed.server._model import ServedModel

    folder = models["pairs"]
    card = read_model_card(folder)
    cfg = parse_config({"device": "cpu", "serve": {"inference_threads": 1, "inference_threads_alone": 2}}).serve
    model = ServedModel("pairs", folder, card, cfg, CPU, ServerMetrics({"pairs": card.batch_size}))
    try:
        model.warm_up()
        assert card.batch_size == 2 and model.describe()["video_window_runs"] == 32
        runner = model.runner
        assert runner.sessions_alone[2] is not runner.sessions[2]
        with runner._host_session(2) as session:
            assert session is runner.sessions_alone[2]  # nothing else runs: every core
        with model.on_lane() as alone:
            assert alone
            with runner._host_session(2) as session:
                assert session is runner.sessions[2]  # beside a run: its share
    finally:
        model.close(drain=False)


@pytest.mark.gpu
@pytest.mark.live
def test_a_gpu_host_on_the_cpu_provider_scores_runs_of_gpu_decoded_frames_as_one_by_one(models, tmp_path):
    """On a GPU host with ``serve.execution_provider: cpu`` the model runs on onnxruntime's CPU provider,
    so a posted video's windows go in runs, though its frames are decoded on the GPU: the runs answer
    what the same server answers window by window (same decoder, same frames)."""
    import shutil

    import httpx

    from gpufeed.config import parse_config
    from gpufeed.device import DeviceChoice
    from gpufeed.server import start_server

    gpu = DeviceChoice("gpu", 0, "test")
    shutil.copytree(models["clip_resnet18"], tmp_path / "repo" / "stacked")
    answers = {}
    for runs in (True, False):
        serve = {"execution_provider": "cpu", "video_window_runs": runs}
        server = start_server(repo=tmp_path / "repo", cfg=parse_config({"serve": serve}), port=0, device=gpu)
        try:
            assert server.state.models["stacked"].describe()["video_window_runs"] == (32 if runs else 0)
            answer = httpx.post(
                f"{server.url}/v1/models/stacked/predict",
                content=models["video"].read_bytes(),
                headers={"content-type": "video/mp4"},
                timeout=120,
            )
        finally:
            server.stop()
        assert answer.status_code == 200, answer.text
        answers[runs] = np.array(answer.json()["scores"], dtype=np.float32)
    assert answers[True].shape == answers[False].shape == (90, 3)
    assert np.abs(answers[True] - answers[False]).max() < 1e-5
