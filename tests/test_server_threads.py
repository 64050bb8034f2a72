"""One thread budget, resolved when the server starts from ``serve`` and the device and handed to every model.

The budget holds the shares (each lane's decoder and onnxruntime threads, and every core for a
batch alone) and the two counts of the server's batches that say when a batch is alone; the
models of one server share them, as the process-wide counters they replace were shared.
"""

from __future__ import annotations

from _serving import IMAGE_MODEL, exported_repo

from gpufeed.config import parse_config
from gpufeed.device import DeviceChoice

CPU = DeviceChoice("cpu", None, "test")


def test_the_thread_budget_is_resolved_once_from_serve_and_the_device():
    from gpufeed.server._threads import ThreadBudget

    serve = parse_config(None).serve
    assert ThreadBudget.resolve(serve, CPU, cores=8) == ThreadBudget(8, 2, 4, 8, 4, 8)
    gpu = DeviceChoice("gpu", 0, "test")
    assert ThreadBudget.resolve(serve, gpu, cores=8) == ThreadBudget(8, 2, 0, 0, 4, 8), (
        "on a GPU: onnxruntime's threads"
    )
    given = parse_config(
        {"serve": {"workers_per_model": 4, "inference_threads": 3, "decode_threads": 1, "decode_threads_alone": 2}}
    ).serve
    assert ThreadBudget.resolve(given, CPU, cores=8) == ThreadBudget(8, 4, 3, 8, 1, 2)


def test_the_models_of_a_server_share_one_budget_and_its_load():
    """A batch of one model in inference makes another model's batch take the shared session."""
    from gpufeed.server._model import ServedModel
    from gpufeed.server._repo import load_repository
    from gpufeed.server._state import ServingState

    cfg = parse_config({"serve": {"decode_threads": 1, "inference_threads": 1, "inference_threads_alone": 2}}).serve
    state = ServingState(load_repository(exported_repo()), cfg, CPU)
    entry = state.entries[IMAGE_MODEL]
    first, second = (
        ServedModel(entry.name, entry.dir, entry.card, cfg, CPU, state.metrics, state.budget) for _ in "ab"
    )
    try:
        assert first.budget is second.budget is state.budget
        runner = second.runner
        with runner._host_session(2) as session:
            assert session is runner.sessions_alone[2], "nothing else in inference: every core"
        with first.runner.inferences.one(), runner._host_session(2) as session:
            assert session is runner.sessions[2], "the other model's batch counts: the lane's share"
    finally:
        first.close()
        second.close()


def test_a_clip_model_says_it_decodes_encoded_videos():
    """The start-up log's line for a clip model names its video decoder, not "none"."""
    from _serving import CLIP_MODEL

    from gpufeed.server._model import ServedModel
    from gpufeed.server._repo import load_repository
    from gpufeed.server._state import ServingState

    cfg = parse_config(None).serve
    state = ServingState(load_repository(exported_repo()), cfg, CPU)
    entry = state.entries[CLIP_MODEL]
    model = ServedModel(entry.name, entry.dir, entry.card, cfg, CPU, state.metrics, state.budget)
    try:
        assert model.describe()["decode"] == "encoded videos in order with PyAV on the CPU; or decoded UINT8 clips"
    finally:
        model.close()


def test_warm_up_runs_every_lanes_batches_in_inference_side_by_side():
    """As under load: each session runs as many batches at once as the model has lanes before any request.

    On a GPU, onnxruntime gives a run that starts beside another its own streams, cuBLAS and cuDNN
    handles and arena memory; a warm-up of one batch at a time left that to the first busy requests.
    Here, on the CPU, the lanes' shared sessions (a batch beside another) also ran for the first time
    inside a request: warm-up ran only the all-cores ones.
    """
    import contextlib
    import threading
    import time

    from gpufeed.server._model import ServedModel
    from gpufeed.server._repo import load_repository
    from gpufeed.server._state import ServingState

    cfg = parse_config({"serve": {"decode_threads": 1, "inference_threads": 1, "inference_threads_alone": 2}}).serve
    state = ServingState(load_repository(exported_repo()), cfg, CPU)
    entry = state.entries[IMAGE_MODEL]
    model = ServedModel(entry.name, entry.dir, entry.card, cfg, CPU, state.metrics, state.budget)
    runner, real_run = model.runner, model.runner.run
    lock, now, most, sessions = threading.Lock(), {}, {}, set()
    real_host_session = runner._host_session

    @contextlib.contextmanager
    def host_session(size):  # which sessions ran: the shared or the all-cores one of each size
        with real_host_session(size) as session:
            sessions.add((size, "alone" if session is runner.sessions_alone.get(size) else "shared"))
            # A test model's batch runs in about a millisecond, less than a busy machine may take to
            # wake the other lane's thread: held as long as a real model's batch, so the two meet.
            time.sleep(0.05)
            yield session

    def run(batch):
        size = len(batch)
        with lock:
            now[size] = now.get(size, 0) + 1
            most[size] = max(most.get(size, 0), now[size])
        try:
            return real_run(batch)
        finally:
            with lock:
                now[size] -= 1

    runner.run, runner._host_session = run, host_session
    try:
        model.warm_up()
        assert model.workers == 2
        assert most == dict.fromkeys(model.batch_sizes, 2), "every size's session ran two batches at once"
        assert sessions == {(n, kind) for n in model.batch_sizes for kind in ("alone", "shared")}
    finally:
        model.close()
