"""The inference server end to end: a real uvicorn server on a loopback port, real clients (tritonclient,
httpx), real exported models, real JPEG/PNG files from the synthetic dataset."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch
import tritonclient.http as triton
from _serving import CLASSES, CLIP_BATCH, CLIP_MODEL, IMAGE_BATCH, IMAGE_MODEL, exported_dense_repo, exported_repo
from prometheus_client.parser import text_string_to_metric_families

from gpufeed.config import ImagePipelineConfig, LoaderConfig, parse_config
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ImageLoader
from gpufeed.pipelines._epochs import default_num_threads
from gpufeed.server import start_server

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")


@pytest.fixture(scope="module")
def server(kserve_server):
    """The session's shared CPU server (tests/conftest.py)."""
    return kserve_server


def _client(server, concurrency=1):
    return triton.InferenceServerClient(server.url.removeprefix("http://"), concurrency=concurrency)


def _bytes_input(blobs):
    return triton.InferInput("image", [len(blobs)], "BYTES").set_data_from_numpy(
        np.array(blobs, dtype=object), binary_data=True
    )


def _metrics(server) -> dict[tuple, float]:
    text = httpx.get(server.url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _direct_logits(model_dir: Path, batch: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    n = session.get_inputs()[0].shape[0]
    if not isinstance(n, int):  # a symbolic batch dimension: any number of rows at once
        return session.run(None, {"pixels": batch})[0]
    rows = []
    for start in range(0, len(batch), n):
        chunk = batch[start : start + n]
        padded = np.concatenate([chunk, np.zeros((n - len(chunk), *chunk.shape[1:]), np.uint8)])
        rows.append(session.run(None, {"pixels": padded})[0][: len(chunk)])
    return np.concatenate(rows)


def test_tritonclient_round_trip(server, val_set):
    client = _client(server)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(IMAGE_MODEL) and client.is_model_ready(CLIP_MODEL)
    meta = client.get_model_metadata(IMAGE_MODEL)
    assert {i["name"]: i["datatype"] for i in meta["inputs"]} == {"image": "BYTES", "pixels": "UINT8"}
    assert meta["parameters"]["labels"] == list(CLASSES) and meta["parameters"]["batch_size"] == IMAGE_BATCH
    assert "source_checkpoint" not in str(meta), "no server file paths over HTTP"

    blobs = [Path(p).read_bytes() for p in val_set.paths[:3]]
    result = client.infer(IMAGE_MODEL, [_bytes_input(blobs)])
    logits, scores = result.as_numpy("logits"), result.as_numpy("scores")
    assert logits.shape == (3, 4) and logits.dtype == np.float32
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)

    as_json = client.infer(
        IMAGE_MODEL,
        [_bytes_input(blobs[:1])],
        outputs=[triton.InferRequestedOutput("logits", binary_data=False)],
    )
    np.testing.assert_allclose(as_json.as_numpy("logits"), logits[:1], rtol=1e-6)
    top = client.infer(
        IMAGE_MODEL, [_bytes_input(blobs[:1])], outputs=[triton.InferRequestedOutput("scores", class_count=2)]
    ).as_numpy("scores")
    best = int(np.argmax(scores[0]))
    assert top.shape == (1, 2) and top[0, 0].decode().endswith(f":{best}:{CLASSES[best]}")


def test_server_scores_equal_direct_onnxruntime_on_evaluation_pipeline_inputs(server, val_set):
    model_dir = exported_repo() / IMAGE_MODEL
    loader = ImageLoader(
        val_set,
        train=False,
        image_cfg=ImagePipelineConfig(size_px=48),
        loader_cfg=LoaderConfig(batch_size=8, num_threads=2),
        device=CPU,
    )
    pixels, ids = [], []
    for batch in loader:
        pixels.append(batch.images.contiguous().numpy())
        ids += batch.sample_ids.tolist()
    expected = _direct_logits(model_dir, np.concatenate(pixels))
    client = _client(server)
    got = np.concatenate(
        [
            client.infer(
                IMAGE_MODEL, [_bytes_input([Path(val_set.paths[i]).read_bytes() for i in ids[k : k + 5]])]
            ).as_numpy("logits")
            for k in range(0, len(ids), 5)
        ]
    )
    # Same DALI operators and crop windows as evaluation: the server feeds the model the same pixels.
    np.testing.assert_allclose(got, expected, atol=1e-5)

    rest = httpx.post(
        server.url + f"/v1/models/{IMAGE_MODEL}/predict?top_k=99",  # above the 4 classes: all of them
        content=Path(val_set.paths[ids[0]]).read_bytes(),
        headers={"content-type": "image/jpeg" if val_set.paths[ids[0]].endswith(".jpg") else "image/png"},
    ).json()
    ((prediction),) = rest["predictions"]
    e = np.exp(expected[0] - expected[0].max())
    probs = e / e.sum()
    assert [t["label"] for t in prediction["top_k"]] == [CLASSES[j] for j in np.argsort(-probs, kind="stable")]
    np.testing.assert_allclose([t["score"] for t in prediction["top_k"]], np.sort(probs)[::-1], rtol=1e-5)


@pytest.mark.live
@pytest.mark.parametrize("batch_sizes", [[], [IMAGE_BATCH]], ids=["sizes-1-2-4", "size-4-only"])
def test_concurrent_requests_get_the_answers_they_get_alone(server, val_set, batch_sizes):
    """With every batch size (a request runs at once when the model is free) and with the largest alone
    (requests wait up to max_delay_ms for a full batch): each answer is the one it gets alone."""
    blobs = [Path(p).read_bytes() for p in val_set.paths[:12]]
    client = _client(server)
    alone = [client.infer(IMAGE_MODEL, [_bytes_input([b])]).as_numpy("logits")[0] for b in blobs]
    target = server
    if batch_sizes:
        cfg = parse_config(
            {"serve": {"max_delay_ms": 50, "decode_threads": 2, "warmup_batches": 1, "batch_sizes": batch_sizes}}
        )
        target = start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU)
    try:
        before = _metrics(target)
        many = _client(target, concurrency=12)
        counts = (1, 2, 3, IMAGE_BATCH, IMAGE_BATCH + 1, 12)
        for count in counts:
            pending = [many.async_infer(IMAGE_MODEL, [_bytes_input([b])]) for b in blobs[:count]]
            for k, request in enumerate(pending):
                np.testing.assert_allclose(request.get_result().as_numpy("logits")[0], alone[k], atol=1e-6)
        after = _metrics(target)
    finally:
        if target is not server:
            target.stop()

    def delta(name, **labels):
        key = (name, tuple(sorted({"model": IMAGE_MODEL, **labels}.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    batches, rows = delta("gpufeed_server_batch_size_count"), delta("gpufeed_server_batch_size_sum")
    assert rows == sum(counts) and 1 <= batches <= sum(counts), "every request ran once, in batches"
    assert delta("gpufeed_server_batch_size_bucket", le=f"{IMAGE_BATCH:.1f}") == batches, "no batch above N"
    if batch_sizes:
        assert batches < sum(counts), "concurrent requests were batched together"
        assert batches > delta("gpufeed_server_batch_size_bucket", le="1.0"), "some batches held several requests"


@pytest.mark.live
def test_a_request_that_times_out_while_queued_never_runs(val_set):
    """504 with the request's images still queued: they leave the queue and no batch ever runs them."""
    cfg = parse_config(
        {
            "serve": {
                "max_delay_ms": 2500,  # 3 images are no batch size (1, 2, 4): they wait for a fourth ...
                "request_timeout_seconds": 0.5,  # ... longer than the request may wait
                "warmup_batches": 1,
                "decode_threads": 2,
            }
        }
    )
    running = start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU)
    try:
        blobs = [Path(p).read_bytes() for p in val_set.paths[:3]]
        before = _metrics(running)
        files = [("image", (f"{k}.jpg", b, "image/jpeg")) for k, b in enumerate(blobs)]
        response = httpx.post(f"{running.url}/v1/models/{IMAGE_MODEL}/predict", files=files, timeout=30)
        assert response.status_code == 504 and response.json()["reason"] == "timeout"
        assert running.state.models[IMAGE_MODEL].batcher.depth == 0, "its images left the queue at once"
        time.sleep(3.0)  # past the moment the batch would have run
        after = _metrics(running)
        count = ("gpufeed_server_batch_size_count", (("model", IMAGE_MODEL),))
        decodes = ("gpufeed_server_stage_seconds_count", (("model", IMAGE_MODEL), ("stage", "decode")))
        assert after[count] == before[count] and after[decodes] == before[decodes], "nothing was decoded or run"
        ok = httpx.post(f"{running.url}/v1/models/{IMAGE_MODEL}/predict", files=files[:2], timeout=30)
        assert ok.status_code == 200 and len(ok.json()["predictions"]) == 2, "2 images: a batch size, no wait"
    finally:
        running.stop()


@pytest.mark.live
def test_two_workers_per_model_give_the_same_answers(server, val_set):
    cfg = parse_config({"serve": {"max_delay_ms": 1, "warmup_batches": 1, "workers_per_model": 2, "decode_threads": 1}})
    overlapped = start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU)
    try:
        where = overlapped.state.models[IMAGE_MODEL].describe()
        cores = default_num_threads()
        assert where["workers"] == 2 and where["threads"] == {
            "decode_per_worker": 1,  # serve.decode_threads
            "decode_alone": cores if cores > 1 else 0,  # a lone batch decodes on every core, in bands
            "inference_alone": cores,  # a lone batch: every core
            "inference_shared": max(1, cores // 2),
        }, where
        blobs = [Path(p).read_bytes() for p in val_set.paths[:16]]
        alone = [_client(server).infer(IMAGE_MODEL, [_bytes_input([b])]).as_numpy("logits")[0] for b in blobs]
        many = _client(overlapped, concurrency=16)
        pending = [many.async_infer(IMAGE_MODEL, [_bytes_input([b])]) for b in blobs]
        for k, request in enumerate(pending):
            np.testing.assert_allclose(request.get_result().as_numpy("logits")[0], alone[k], atol=1e-6)
    finally:
        overlapped.stop()


def test_metrics_move_after_requests(server, val_set):
    before = _metrics(server)
    blob = Path(val_set.paths[0]).read_bytes()
    assert (
        httpx.post(server.url + f"/v1/models/{IMAGE_MODEL}/predict", files={"image": ("a.jpg", blob)}).status_code
        == 200
    )
    _client(server).infer(IMAGE_MODEL, [_bytes_input([blob])])
    after = _metrics(server)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    for protocol in ("rest", "kserve"):
        assert delta("gpufeed_server_requests_total", model=IMAGE_MODEL, protocol=protocol, code="200") == 1
        assert delta("gpufeed_server_request_seconds_count", model=IMAGE_MODEL, protocol=protocol) == 1
    for stage in ("preprocess", "queue_wait", "decode", "inference", "postprocess"):
        assert delta("gpufeed_server_stage_seconds_count", model=IMAGE_MODEL, stage=stage) >= 2, stage
        assert delta("gpufeed_server_stage_seconds_sum", model=IMAGE_MODEL, stage=stage) > 0, stage
    assert delta("gpufeed_server_batch_fill_ratio_count", model=IMAGE_MODEL) >= 1
    assert after[("gpufeed_server_model_ready", (("model", IMAGE_MODEL),))] == 1
    assert after[("gpufeed_server_queue_depth", (("model", IMAGE_MODEL),))] == 0
    assert after[("gpufeed_server_inflight_requests", ())] == 0


def test_clip_model_through_the_uint8_tensor_path(server):
    clips = np.random.default_rng(3).integers(0, 256, (CLIP_BATCH + 1, 3, 4, 32, 32), dtype=np.uint8)
    tensor = triton.InferInput("pixels", list(clips.shape), "UINT8").set_data_from_numpy(clips)
    result = _client(server).infer(CLIP_MODEL, [tensor])
    expected = _direct_logits(exported_repo() / CLIP_MODEL, clips)
    np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("scores"), 1 / (1 + np.exp(-expected)), atol=1e-6)  # multilabel

    rest = httpx.post(
        server.url + f"/v1/models/{CLIP_MODEL}/predict", content=b"\xff\xd8", headers={"content-type": "image/jpeg"}
    )
    assert rest.status_code == 415 and "clip model" in rest.json()["error"]
    with pytest.raises(triton.InferenceServerException, match="clip model"):
        _client(server).infer(CLIP_MODEL, [_bytes_input([b"\xff\xd8\xff"])])


def test_a_bad_image_in_a_batch_fails_alone(server, val_set):
    from gpufeed.synth._damaged import png_with_damaged_data

    png = next(p for p in val_set.paths if p.endswith(".png"))
    damaged = png_with_damaged_data(Path(png).read_bytes())  # passes validation, fails in DALI
    good = [Path(p).read_bytes() for p in val_set.paths[:3]]
    client = _client(server)
    alone = [client.infer(IMAGE_MODEL, [_bytes_input([b])]).as_numpy("logits")[0] for b in good]
    many = _client(server, concurrency=4)
    # Sent together, inside one max_delay window: they share a batch.
    results = [many.async_infer(IMAGE_MODEL, [_bytes_input([b])]) for b in [*good, damaged]]
    for k in range(3):
        np.testing.assert_allclose(results[k].get_result().as_numpy("logits")[0], alone[k], atol=1e-6)
    with pytest.raises(triton.InferenceServerException, match="damaged") as info:
        results[3].get_result()
    assert info.value.status() == "400"
    assert client.is_server_ready()


def _served_model(batch_sizes=()):
    from gpufeed.models import read_model_card
    from gpufeed.server._metrics import ServerMetrics
    from gpufeed.server._model import ServedModel

    model_dir = exported_repo() / IMAGE_MODEL
    card = read_model_card(model_dir)
    cfg = parse_config({"serve": {"decode_threads": 2, "batch_sizes": list(batch_sizes)}}).serve
    return ServedModel(IMAGE_MODEL, model_dir, card, cfg, CPU, ServerMetrics({IMAGE_MODEL: card.batch_size}))


def _item(blob, where="test image"):
    from gpufeed.server._items import Item
    from gpufeed.server._preprocess import inspect_image

    info = inspect_image(blob, 10**8)
    return Item(encoded=blob, size=(info.width, info.height), where=where)


def test_batch_step_runs_at_the_smallest_size_that_holds_the_batch_and_isolates_a_bad_row(val_set):
    """ServedModel.run_batch without HTTP: at every batch size, rows come back in order whatever the mix,
    each equal to its answer alone (no neighbour or padding leaks in), padding discarded."""
    from gpufeed.server import RequestError
    from gpufeed.server._items import Item
    from gpufeed.synth._damaged import png_with_damaged_data

    model = _served_model()
    try:
        assert model.batch_sizes == (1, 2, IMAGE_BATCH) and sorted(model.runner.sessions) == [1, 2, IMAGE_BATCH]
        assert [model.runner.bucket_for(k) for k in range(1, IMAGE_BATCH + 1)] == [1, 2, 4, 4]
        blobs = [Path(p).read_bytes() for p in val_set.paths[:IMAGE_BATCH]]
        png = Path(next(p for p in val_set.paths if p.endswith(".png"))).read_bytes()
        damaged = png_with_damaged_data(png)
        alone = [model.run_batch([_item(b)])[0] for b in blobs]  # batch size 1, no padding
        pixels = np.zeros(model.card.sample_shape, np.uint8)
        (zero_row,) = model.run_batch([Item(pixels=pixels)])
        for k in range(1, IMAGE_BATCH + 1):  # sizes 1, 2, 4 and 3 (at 4, one padding row)
            together = model.run_batch([_item(b) for b in blobs[:k]])
            np.testing.assert_allclose(np.stack(together), np.stack(alone[:k]), atol=1e-6, err_msg=f"{k} rows")
            reversed_ = model.run_batch([_item(b) for b in blobs[:k][::-1]])
            np.testing.assert_allclose(np.stack(reversed_[::-1]), np.stack(alone[:k]), atol=1e-6)
        for mix in (
            [Item(pixels=pixels), _item(blobs[0]), _item(damaged), _item(blobs[2])],  # size 4
            [_item(damaged), Item(pixels=pixels), _item(blobs[2])],  # 3 at size 4
            [_item(blobs[0]), _item(damaged)],  # size 2
        ):
            out = model.run_batch(mix)
            for item, result in zip(mix, out, strict=True):
                if item.encoded is damaged:
                    assert isinstance(result, RequestError) and result.reason == "corrupt_image"
                    assert result.message.startswith("test image: the image data is damaged")
                elif item.pixels is not None:
                    np.testing.assert_allclose(result, zero_row, atol=1e-6)
                else:
                    np.testing.assert_allclose(result, alone[blobs.index(item.encoded)], atol=1e-6)
        again = model.run_batch([_item(b) for b in blobs[:3]])  # the decoder is healthy afterwards
        np.testing.assert_allclose(np.stack(again), np.stack(alone[:3]), atol=1e-6)
        with pytest.raises(ValueError, match="exceed the batch size"):
            model.run_batch([Item(pixels=pixels)] * (IMAGE_BATCH + 1))
    finally:
        model.close()

    fixed = _served_model(batch_sizes=[IMAGE_BATCH])  # serve.batch_sizes: run the card's largest only
    try:
        assert fixed.batch_sizes == (IMAGE_BATCH,) and list(fixed.runner.sessions) == [IMAGE_BATCH]
        np.testing.assert_allclose(fixed.run_batch([_item(blobs[1])])[0], alone[1], atol=1e-6)
    finally:
        fixed.close()


def test_runner_has_a_session_per_batch_size_and_refuses_other_sizes():
    from gpufeed.models import read_model_card
    from gpufeed.server._runtime import OnnxRunner, RuntimeSetupError

    model_dir = exported_repo() / IMAGE_MODEL
    card = read_model_card(model_dir)
    runner = OnnxRunner(model_dir, card, CPU)
    assert runner.batch_sizes == card.batch_sizes == (1, 2, IMAGE_BATCH)
    assert {n: s.get_inputs()[0].shape[0] for n, s in runner.sessions.items()} == {1: 1, 2: 2, 4: 4}
    batch = runner.new_batch()
    assert batch.shape == card.input_shape
    with pytest.raises(ValueError, match=r"a batch of 3 rows: this model runs batches of \[1, 2, 4\]"):
        runner.run(batch[:3])
    with pytest.raises(ValueError, match="5 rows: a batch holds 1 to 4"):
        runner.bucket_for(5)
    with pytest.raises(RuntimeSetupError, match=r"batch sizes \[2\] are not a subset"):
        OnnxRunner(model_dir, card, CPU, batch_sizes=(2,))


@pytest.mark.parametrize("model", [IMAGE_MODEL, "depth", "seg"])
def test_the_bound_run_takes_the_graphs_output_shape(model):
    """The GPU path's I/O binding, run here on host buffers: onnxruntime refuses an output buffer whose
    rank is not the graph's, so a dense model's (n, C, H, W) maps need their own shape, not (n, C)."""
    from gpufeed.models import read_model_card
    from gpufeed.server._runtime import OnnxRunner

    model_dir = (exported_repo() if model == IMAGE_MODEL else exported_dense_repo()) / model
    card = read_model_card(model_dir)
    runner = OnnxRunner(model_dir, card, CPU)
    rows = np.random.default_rng(3).integers(0, 256, (2, *card.sample_shape), dtype=np.uint8)
    session = runner.sessions[2]
    output = runner.output_buffer(2, "cpu")
    runner.run_bound(session, session.io_binding(), torch.from_numpy(rows), output, "cpu", 0)
    assert tuple(output.shape) == card.spec.output_shape(2)
    np.testing.assert_array_equal(output.numpy(), runner.run(rows))


def test_a_lone_batch_gets_every_core_and_batches_side_by_side_their_share():
    """Thread budgets that follow load: the all-cores session only while no other batch is in inference."""
    from gpufeed.models import read_model_card
    from gpufeed.server._runtime import OnnxRunner

    model_dir = exported_repo() / IMAGE_MODEL
    card = read_model_card(model_dir)
    runner = OnnxRunner(model_dir, card, CPU, threads=1, threads_alone=2)
    assert runner.threads == {"alone": 2, "shared": 1}
    for n in runner.batch_sizes:
        assert runner.sessions_alone[n].get_session_options().intra_op_num_threads == 2
        assert runner.sessions[n].get_session_options().intra_op_num_threads == 1
    with runner._host_session(2) as first:
        assert first is runner.sessions_alone[2], "no other batch in inference: every core"
        with runner._host_session(2) as second:
            assert second is runner.sessions[2], "beside another batch: the lane's share"
    with runner._host_session(2) as again:
        assert again is runner.sessions_alone[2], "the count went back down"
    batch = runner.new_batch()[:2]
    batch[:] = np.arange(batch.size, dtype=np.uint64).reshape(batch.shape) % 251
    name, feed = runner.output_name, {card.input_name: batch}
    alone, shared = (s[2].run([name], feed)[0] for s in (runner.sessions_alone, runner.sessions))
    np.testing.assert_array_equal(runner.run(batch), alone)
    np.testing.assert_allclose(alone, shared, rtol=1e-5, atol=1e-6)
    # Not above the shared budget (or on a GPU): one set of sessions.
    assert OnnxRunner(model_dir, card, CPU, threads=2, threads_alone=2).sessions_alone == {}


def test_items_given_up_inside_a_taken_batch_are_not_decoded_or_run(val_set):
    """A 504 while the batch waits to start: run_batch drops those items and runs the rest at a smaller size."""
    import threading
    from concurrent.futures import CancelledError

    from gpufeed.server import Batcher

    model = _served_model()
    model.warm_up()  # ready: batches are counted in the metrics from now on
    blobs = [Path(p).read_bytes() for p in val_set.paths[:3]]
    hold = threading.Event()

    def step(items):
        hold.wait(10)  # taken, not yet started: its callers give up meanwhile
        return model.run_batch(items)

    batcher = Batcher(step, batch_size=IMAGE_BATCH, batch_sizes=model.batch_sizes, max_delay_s=0.0, capacity=8)
    batcher.start()

    def batches() -> tuple[float, float]:
        """(batches run, rows run) from the model's own metrics."""
        labels = {"model": IMAGE_MODEL}
        get = model.metrics.registry.get_sample_value
        return get("gpufeed_server_batch_size_count", labels), get("gpufeed_server_batch_size_sum", labels)

    def taken() -> None:
        deadline = time.monotonic() + 5
        while batcher.depth and time.monotonic() < deadline:
            time.sleep(0.005)

    try:
        alone = model.run_batch([_item(blobs[0])])[0]
        before = batches()
        kept, *doomed = batcher.submit([_item(b) for b in blobs])
        taken()
        batcher.cancel(doomed)
        hold.set()
        np.testing.assert_allclose(kept.result(timeout=30), alone, atol=1e-6)
        for future in doomed:
            with pytest.raises(CancelledError):
                future.result(timeout=5)
        after = batches()
        assert (after[0] - before[0], after[1] - before[1]) == (1, 1), "one batch of one row ran, at size 1"

        hold.clear()
        everyone_left = batcher.submit([_item(b) for b in blobs[:2]])
        taken()
        batcher.cancel(everyone_left)
        hold.set()
        for future in everyone_left:
            with pytest.raises(CancelledError):
                future.result(timeout=5)
        assert batches() == after, "a batch whose callers all left decodes and runs nothing"
    finally:
        hold.set()
        batcher.close()
        model.close()


@pytest.mark.live
def test_serve_demo_stage_exports_serves_and_reports(synth_dir, tmp_path, capsys):
    from gpufeed.demo import demo_config, run_serve_demo
    from gpufeed.models._io import untrained_checkpoint

    out = tmp_path / "demo"
    out.mkdir()
    (out / "data").symlink_to(synth_dir, target_is_directory=True)
    cfg = demo_config(out, "cpu")
    checkpoint = untrained_checkpoint(out, ("amber", "birch", "cedar", "daisy"), 48, architecture="smallcnn")
    figures = run_serve_demo(cfg, out, CPU, checkpoint, batch_size=4)
    printed = capsys.readouterr().out
    assert figures["images"] == 32 and figures["agreement"] == 1.0
    assert (out / "models" / "classifier" / "model.onnx").is_file()
    for stage in (
        "preprocess",
        "queue_wait",
        "decode",
        "inference",
        "postprocess",
        "request (kserve)",
        "request (rest)",
    ):
        assert stage in printed, stage


def test_histogram_quantile_matches_prometheus_interpolation():
    from gpufeed.server._report import histogram_quantile

    buckets = [(0.1, 10.0), (0.2, 30.0), (0.5, 40.0), (float("inf"), 40.0)]
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.15)  # rank 20: halfway through (0.1, 0.2]
    assert histogram_quantile(1.0, buckets) == pytest.approx(0.5)
    assert np.isnan(histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]))


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="needs promtool (Debian/Ubuntu: apt-get install prometheus)"
)
def test_metrics_pass_promtool_lint(server, val_set):
    httpx.post(
        server.url + f"/v1/models/{IMAGE_MODEL}/predict", content=Path(val_set.paths[0]).read_bytes(),
        headers={"content-type": "image/jpeg"},
    )  # fmt: skip
    text = httpx.get(server.url + "/metrics").text
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check.stdout + check.stderr
    for name in (
        "gpufeed_server_stage_seconds_bucket",
        "gpufeed_server_request_seconds_bucket",
        "gpufeed_server_batch_size_bucket",
        "gpufeed_server_batch_fill_ratio_bucket",
        "gpufeed_server_queue_depth",
        "gpufeed_server_inflight_requests",
        "gpufeed_server_model_ready",
        "gpufeed_server_requests_total",
        "gpufeed_server_errors_total",
    ):
        assert f"\n{name}" in text, name
