"""Encoded video into the server: a clip model answers per-frame scores, the same numbers as ``gpufeed predict``.

A real server (the session's shared one, tests/conftest.py) with real clients: httpx for REST,
tritonclient's HTTP client and KServe's own SDK for KServe v2; the videos are tagged h264 files, one
of them camera-like (B-frames, scene-cut GOPs, a variable frame rate, a size no multiple of 16).
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from _serving import CLIP_MODEL, IMAGE_MODEL, exported_repo, run_kserve_client
from predicthelp import CPU
from videohelp import encode_tagged_video

from gpufeed.models import WindowPlan
from gpufeed.predict import load_predictor, predict_videos
from gpufeed.predict._outputs import read_predictions_csv

pytestmark = pytest.mark.timeout(300)

FRAMES = 61


@pytest.fixture(scope="module")
def camera(tmp_path_factory):
    """A camera-like tagged video: B-frames, scene-cut GOPs, frame durations 33/34/33/40 ms, 106x62."""
    path = tmp_path_factory.mktemp("camera") / "camera.mp4"
    options = {"bf": "3", "g": "25", "keyint_min": "4", "sc_threshold": "40", "crf": "14"}
    encode_tagged_video(path, 4, FRAMES, width=106, height=62, options=options, durations_ms=(33, 34, 33, 40))
    return path


@pytest.fixture(scope="module")
def predicted(camera, tmp_path_factory):
    """``gpufeed predict``'s answer for the camera video with the served model's own export, hops 1 and 3."""
    predictor = load_predictor(exported_repo() / CLIP_MODEL, CPU)
    out = {}
    for hop in (1, 3):
        folder = tmp_path_factory.mktemp(f"predict-hop{hop}")
        report = predict_videos(camera, predictor, out=folder, hop_frames=hop, progress=False)
        assert [r.status for r in report.results] == ["scored"], report.results
        out[hop] = read_predictions_csv(folder / "camera_predictions.csv")[1]
    return out


def _post_video(server, body: bytes, query: str = "", content_type: str = "video/mp4") -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/models/{CLIP_MODEL}/predict{query}",
        content=body,
        headers={"content-type": content_type},
        timeout=120,
    )


def _video_input(module, body: bytes):
    return module.InferInput("video", [1], "BYTES").set_data_from_numpy(np.array([body], dtype=object))


def test_rest_answers_every_frame_as_predict_does(kserve_server, camera, predicted):
    answer = _post_video(kserve_server, camera.read_bytes(), "?windows=true")
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    scores = np.array(doc["scores"], dtype=np.float32)
    assert scores.shape == (FRAMES, 4) and doc["frames"] == FRAMES
    assert np.abs(scores - predicted[1]).max() < 1e-5, "the served video and gpufeed predict agree"
    plan = WindowPlan(4, 1, 1)
    assert doc["window_starts"] == plan.starts(FRAMES).tolist() and doc["windows"] == plan.window_count(FRAMES)
    windows = np.array(doc["window_scores"], dtype=np.float32)
    # each frame's scores are the mean of the windows covering it
    covering = [(plan.starts(FRAMES) <= i) & (i < plan.starts(FRAMES) + plan.span_frames) for i in range(FRAMES)]
    means = np.stack([windows[c].astype(np.float64).mean(0) for c in covering]).astype(np.float32)
    assert np.abs(means - scores).max() < 1e-6
    assert doc["labels"] == [f"class_{i}" for i in range(4)] and doc["clip_length_frames"] == 4


def test_rest_takes_a_hop_and_says_what_is_wrong_with_one(kserve_server, camera, predicted):
    answer = _post_video(kserve_server, camera.read_bytes(), "?hop_frames=3")
    assert answer.status_code == 200, answer.text
    assert np.abs(np.array(answer.json()["scores"], np.float32) - predicted[3]).max() < 1e-5
    assert "window_scores" not in answer.json(), "per-window scores only when asked"
    refused = _post_video(kserve_server, camera.read_bytes(), "?hop_frames=9")
    assert refused.status_code == 400 and "hop_frames 9 leaves frames no window covers: it must be 1..4" in refused.text
    refused = _post_video(kserve_server, camera.read_bytes(), "?hop_frames=two")
    assert (
        refused.status_code == 400
        and refused.json()["error"] == "query parameter hop_frames must be an integer, got 'two'"
    )


def test_tritonclient_sends_a_video_as_bytes(kserve_server, camera, predicted):
    client = triton.InferenceServerClient(kserve_server.url.removeprefix("http://"))
    result = client.infer(CLIP_MODEL, [_video_input(triton, camera.read_bytes())])
    assert np.abs(result.as_numpy("scores") - predicted[1]).max() < 1e-5
    outputs = [triton.InferRequestedOutput(name) for name in ("scores", "window_starts", "window_scores")]
    result = client.infer(
        CLIP_MODEL, [_video_input(triton, camera.read_bytes())], outputs=outputs, parameters={"hop_frames": 3}
    )
    starts = result.as_numpy("window_starts")
    assert starts.dtype == np.int64 and starts.tolist() == WindowPlan(4, 1, 3).starts(FRAMES).tolist()
    assert result.as_numpy("window_scores").shape == (len(starts), 4)
    assert np.abs(result.as_numpy("scores") - predicted[3]).max() < 1e-5


def test_kserve_json_base64_video(kserve_server, camera, predicted):
    body = {
        "inputs": [
            {
                "name": "video",
                "datatype": "BYTES",
                "shape": [1],
                "data": [base64.b64encode(camera.read_bytes()).decode()],
            }
        ]
    }
    answer = httpx.post(f"{kserve_server.url}/v2/models/{CLIP_MODEL}/infer", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    assert output["name"] == "scores" and output["shape"] == [FRAMES, 4]
    assert np.abs(np.array(output["data"], np.float32).reshape(FRAMES, 4) - predicted[1]).max() < 1e-5


def test_the_kserve_sdk_sends_a_video(kserve_server, camera, predicted):
    status, answer = run_kserve_client("rest", kserve_server.url, "video", [camera], model=CLIP_MODEL)
    assert status == 0, answer
    assert np.abs(np.array(answer["scores"], np.float32) - predicted[1]).max() < 1e-5


def test_metadata_and_config_say_what_a_video_input_takes(kserve_server):
    meta = httpx.get(f"{kserve_server.url}/v2/models/{CLIP_MODEL}").json()
    assert meta["inputs"][0] == {"name": "video", "datatype": "BYTES", "shape": [1]}
    outputs = {o["name"]: o for o in meta["outputs"]}
    assert outputs["window_starts"]["datatype"] == "INT64" and outputs["scores"]["shape"] == [-1, 4]
    params = meta["parameters"]
    assert params["video_max_frames"] == 18_000 and params["video_hop_frames"] == 1
    assert params["video_fit"] == "stretch" and "h264" in params["video_codecs"]
    config = triton.InferenceServerClient(kserve_server.url.removeprefix("http://")).get_model_config(CLIP_MODEL)
    inputs = {i["name"]: i for i in config["input"]}
    assert inputs["video"]["data_type"] == "TYPE_STRING" and inputs["video"]["optional"]
    assert inputs["pixels"]["optional"], "a request sends the video or the pixels"
    assert config["parameters"]["video_max_seconds"] == {"string_value": "900.0"}
    image_meta = httpx.get(f"{kserve_server.url}/v2/models/{IMAGE_MODEL}").json()
    assert (
        "video" not in [i["name"] for i in image_meta["inputs"]] and "video_max_frames" not in image_meta["parameters"]
    )


def _unsupported_codec_video(tmp_path) -> bytes:
    import av

    path = tmp_path / "mpeg2.mp4"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg2video", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(8):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 20, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path.read_bytes()


def test_a_phone_video_is_scored_as_shown(kserve_server, tmp_path):
    """A portrait phone video (frames stored turned, a display matrix saying so): the server reads it as
    ``gpufeed predict`` does, as shown, and not as stored (its twin without the matrix scores otherwise)."""
    import av

    from gpufeed.pipelines._orientation import Orientation

    phone, stored = tmp_path / "phone.mp4", tmp_path / "stored.mp4"
    encode_tagged_video(phone, 5, 30, width=62, height=106, shown=Orientation(1, False), labels=False)
    with av.open(str(phone)) as source, av.open(str(stored), "w") as twin:  # the same packets, no display matrix
        stream_in = source.streams.video[0]
        stream = twin.add_stream_from_template(stream_in)
        stream.set_display_rotation(0)  # the template brings the phone's matrix along
        for packet in source.demux(stream_in):
            if packet.dts is not None:
                packet.stream = stream
                twin.mux(packet)
    predictor = load_predictor(exported_repo() / CLIP_MODEL, CPU)
    scores = {}
    for path in (phone, stored):
        report = predict_videos(path, predictor, out=tmp_path / "out", progress=False)
        assert [r.status for r in report.results] == ["scored"], report.results
        scores[path.stem] = read_predictions_csv(tmp_path / "out" / f"{path.stem}_predictions.csv")[1]
    answer = _post_video(kserve_server, phone.read_bytes())
    assert answer.status_code == 200, answer.text
    served = np.array(answer.json()["scores"], dtype=np.float32)
    assert np.abs(served - scores["phone"]).max() < 1e-5, "the served phone video and gpufeed predict agree"
    assert np.abs(scores["stored"] - scores["phone"]).max() > 1e-3, "the turn changes what the model sees"


def test_a_camcorder_transport_stream_is_scored_as_predict_scores_it(kserve_server, tmp_path):
    """An MPEG-TS body (an AVCHD camcorder's .mts) is recognised by its sync bytes and read in order."""
    ts = tmp_path / "00001.mts"
    encode_tagged_video(ts, 6, 24, width=62, height=46, options={"g": "8", "bf": "2"}, labels=False)
    report = predict_videos(ts, load_predictor(exported_repo() / CLIP_MODEL, CPU), out=tmp_path, progress=False)
    assert [r.status for r in report.results] == ["scored"], report.results
    answer = _post_video(kserve_server, ts.read_bytes(), content_type="video/mp2t")
    assert answer.status_code == 200, answer.text
    expected = read_predictions_csv(tmp_path / "00001_predictions.csv")[1]
    assert np.abs(np.array(answer.json()["scores"], dtype=np.float32) - expected).max() < 1e-5


def test_bad_videos_get_a_clear_4xx(kserve_server, camera, tmp_path):
    cases = [
        (b"plain text, no video", 415, "unsupported_media_type", "is not a video container gpufeed reads"),
        (b"", 400, "corrupt_video", "the request body is empty (0 bytes)"),
        (camera.read_bytes()[: len(camera.read_bytes()) // 2], 400, "corrupt_video", "the request body: truncated"),
        (_unsupported_codec_video(tmp_path), 415, "unsupported_media_type", "unsupported codec 'mpeg2video'"),
    ]
    for body, status, reason, words in cases:
        answer = _post_video(kserve_server, body)
        assert (answer.status_code, answer.json()["reason"]) == (status, reason), answer.text
        assert words in answer.json()["error"]
    # a video to an image model, and an image's type to a clip model
    answer = httpx.post(
        f"{kserve_server.url}/v1/models/{IMAGE_MODEL}/predict",
        content=camera.read_bytes(),
        headers={"content-type": "video/mp4"},
    )
    assert answer.status_code == 415 and "Content-Type 'video/mp4' is not accepted" in answer.json()["error"]
    answer = _post_video(kserve_server, camera.read_bytes(), content_type="image/jpeg")
    assert answer.status_code == 415 and "or one encoded video (a video/* body, KServe input 'video')" in answer.text


def test_kserve_video_input_shapes_and_types_are_checked(kserve_server, camera):
    client = triton.InferenceServerClient(kserve_server.url.removeprefix("http://"))
    two = triton.InferInput("video", [2], "BYTES").set_data_from_numpy(np.array([b"a", b"b"], dtype=object))
    with pytest.raises(triton.InferenceServerException, match=r"holds one encoded video: shape \[1\]"):
        client.infer(CLIP_MODEL, [two])
    with pytest.raises(triton.InferenceServerException, match="output 'logits' is not produced"):
        client.infer(
            CLIP_MODEL, [_video_input(triton, camera.read_bytes())], outputs=[triton.InferRequestedOutput("logits")]
        )


@pytest.mark.gpu
@pytest.mark.live
def test_a_gpu_server_answers_as_predict_on_the_gpu(camera, tmp_path):
    """The GPU twin: NVDEC decodes the served video, its windows stay on the GPU up to the model's input
    buffer; ``gpufeed predict`` on the same GPU (NVDEC, onnxruntime's CUDA provider) gives the same numbers."""
    from gpufeed.config import parse_config
    from gpufeed.device import DeviceChoice
    from gpufeed.server import start_server

    gpu = DeviceChoice("gpu", 0, "test")
    report = predict_videos(camera, load_predictor(exported_repo() / CLIP_MODEL, gpu), out=tmp_path, progress=False)
    assert [r.status for r in report.results] == ["scored"], report.results
    expected = read_predictions_csv(tmp_path / "camera_predictions.csv")[1]
    cfg = parse_config({"device": "gpu", "serve": {"max_delay_ms": 5, "warmup_batches": 1}})
    running = start_server(repo=exported_repo(), cfg=cfg, port=0, device=gpu)
    try:
        answer = _post_video(running, camera.read_bytes())
    finally:
        running.stop()
    assert answer.status_code == 200, answer.text
    assert np.abs(np.array(answer.json()["scores"], np.float32) - expected).max() < 1e-5


def test_an_image_folder_gets_the_servers_scores(kserve_server, tmp_path):
    """``gpufeed predict`` with the served image model's export: each row is what the server answers for that file."""
    from _serving import encode, kserve_image_outputs

    from gpufeed.predict import predict_images

    rng = np.random.default_rng(11)
    folder = tmp_path / "photos"
    folder.mkdir()
    blobs = {
        "a.jpg": encode(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)),
        "b.png": encode(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8), "PNG"),
    }
    for name, blob in blobs.items():
        (folder / name).write_bytes(blob)
    report = predict_images(folder, load_predictor(exported_repo() / IMAGE_MODEL, CPU), progress=False)
    assert [r.status for r in report.results] == ["scored", "scored"]
    lines = (folder / "predictions.csv").read_text().splitlines()[1:]
    for line, (name, blob) in zip(lines, sorted(blobs.items()), strict=True):
        cells = line.split(",")
        served = kserve_image_outputs(kserve_server.url, IMAGE_MODEL, blob)["scores"][1][0]
        assert cells[0] == name and np.abs(np.array(cells[1:], np.float32) - served).max() < 1e-5
