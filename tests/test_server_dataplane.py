"""The server has one request path: every protocol reaches the batcher through one data-plane function.

Structural: the server's modules, parsed with ``ast``, call a batcher's ``submit`` from exactly one
function (:meth:`Inference.infer` in ``server/_dataplane.py``), and both fronts (the HTTP handlers,
the gRPC servicer) open their inference requests with the data plane. Behavioural: through a real
server, an HTTP KServe request, a REST request and a gRPC request each reach the model's batcher
exactly once, and every submission comes from that function.
"""

from __future__ import annotations

import ast
import base64
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from _serving import IMAGE_MODEL, encode, exported_repo

from gpufeed.config import parse_config
from gpufeed.device import DeviceChoice
from gpufeed.server import start_server

pytestmark = pytest.mark.timeout(300)

SERVER = Path(__file__).parents[1] / "server"
JPEG = encode(np.random.default_rng(11).integers(0, 256, (40, 52, 3), dtype=np.uint8))


def _own_nodes(function: ast.AST):
    """The nodes of a function's body, not descending into the functions and classes it defines."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def _functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method in a module, nested ones included."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if not isinstance(child, ast.ClassDef):
                yield prefix + child.name, child
            yield from _functions(child, f"{prefix}{child.name}.")
        elif not isinstance(child, ast.Lambda):
            yield from _functions(child, prefix)


def _callers(attribute: str, receiver: str | None = None) -> set[tuple[str, str]]:
    """(module, function) pairs in server/ calling ``<...>.attribute(...)`` (on ``<...>.receiver`` if given).

    A call inside a lambda counts for the function that holds the lambda.
    """
    found = set()
    for path in sorted(SERVER.glob("*.py")):
        for qualname, function in _functions(ast.parse(path.read_text())):
            for node in _own_nodes(function):
                for call in ast.walk(node.body) if isinstance(node, ast.Lambda) else [node]:
                    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                        continue
                    target = call.func.value
                    if call.func.attr != attribute:
                        continue
                    if receiver is not None and not (isinstance(target, ast.Attribute) and target.attr == receiver):
                        continue
                    found.add((path.name, qualname))
    return found


def test_one_function_submits_to_the_batcher():
    # Inference.infer, and its blocking twin for a served video's windows (server/_video.py): one place.
    infers = {("_dataplane.py", "Inference.infer"), ("_dataplane.py", "Inference.infer_rows")}
    assert _callers("submit", receiver="batcher") == infers
    # Nothing else in the server reaches a Batcher's submit by another name either.
    submits = {c for c in _callers("submit") if c[0] not in ("_batcher.py", "_dataplane.py")}
    # (executors' submits: the parser's worker process, a video's scoring thread)
    assert submits <= {("_offload.py", "ParsePool.run_isolated"), ("_video.py", "video_outputs")}, submits


def test_both_fronts_take_requests_through_the_data_plane():
    callers = _callers("inference")
    assert ("_app.py", "infer") in callers and ("_app.py", "predict") in callers, callers
    assert ("_grpc.py", "_Service._infer") in callers, callers
    assert {m for m, _ in callers} == {"_app.py", "_grpc.py"}, "only the fronts open inference requests"
    # The fronts hold no batcher or readiness logic of their own.
    for front in ("_app.py", "_grpc.py"):
        tree = ast.parse((SERVER / front).read_text())
        attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {"batcher", "models", "closing", "inflight"} & attributes, front
        assert "gpufeed.server._batcher" not in imported, front


def test_the_fronts_are_peers_and_keep_one_request_accounting():
    """HTTP does not start gRPC: the model server starts both, and the models' loading; every front
    counts and times its answers through one RequestAccount."""
    assert {c[0] for c in _callers("observe_request")} == {"_accounting.py"}, _callers("observe_request")
    assert {c for c in _callers("start_loading")} == {("_server.py", "ModelServer.serve")}
    app = ast.parse((SERVER / "_app.py").read_text())
    imported = {n.module for n in ast.walk(app) if isinstance(n, ast.ImportFrom)}
    assert "gpufeed.server._grpc" not in imported, "the HTTP app neither imports nor starts the gRPC front"
    grpc_made = {(path.name, node.lineno) for path in SERVER.glob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "GrpcFront"}  # fmt: skip
    assert {name for name, _ in grpc_made} == {"_server.py"}, grpc_made


def test_http_handlers_are_module_level_functions():
    import gpufeed.server._app as app_module
    from gpufeed.server._app import build_app
    from gpufeed.server._repo import load_repository
    from gpufeed.server._state import ServingState

    state = ServingState(load_repository(exported_repo()), parse_config(None).serve, DeviceChoice("cpu", None, "t"))
    app = build_app(state)
    for route in app.routes:
        assert getattr(app_module, route.endpoint.__name__) is route.endpoint, route.path
    app.state.parse_pool.close()


def test_what_lives_as_long_as_the_server_is_frozen_once_warm_and_thawed_at_close():
    """gc.freeze() once every model is warm, so a full collection no longer walks torch, onnxruntime,
    DALI and the models (100-150 ms pauses otherwise); close() gives them back to the collector."""
    import gc

    from gpufeed.server._repo import load_repository
    from gpufeed.server._state import ServingState

    cfg = parse_config({"device": "cpu", "serve": {"warmup_batches": 1}}).serve
    state = ServingState(load_repository(exported_repo()), cfg, DeviceChoice("cpu", None, "t"))
    gc.unfreeze()
    try:
        state.load()
        assert state.load_error is None and state.ready
        assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()
        model = state.models[IMAGE_MODEL]
        # The permanent generation is not among the collected ones.
        assert not any(o is model for o in gc.get_objects()), "the warm model is out of the collector's sight"
        made_while_serving = [model]
        assert any(o is made_while_serving for o in gc.get_objects()), "new objects are collected as before"
    finally:
        state.close(drain=False)
    assert gc.get_freeze_count() == 0
    assert any(o is model for o in gc.get_objects())


def test_a_handler_answers_without_the_app():
    """A handler needs only a request whose app state holds a data plane (no routing, no lifespan)."""
    import asyncio
    import json
    from types import SimpleNamespace

    from starlette.requests import Request

    from gpufeed.server._app import model_metadata, model_ready
    from gpufeed.server._dataplane import DataPlane
    from gpufeed.server._offload import ParsePool
    from gpufeed.server._repo import load_repository
    from gpufeed.server._state import ServingState

    state = ServingState(load_repository(exported_repo()), parse_config(None).serve, DeviceChoice("cpu", None, "t"))
    pool = ParsePool(threads=1)
    app = SimpleNamespace(state=SimpleNamespace(plane=DataPlane(state, pool)))
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "app": app}

    def call(handler, **params):
        return asyncio.run(handler(Request({**scope, "path_params": params})))

    metadata = json.loads(call(model_metadata, name=IMAGE_MODEL).body)
    assert metadata["name"] == IMAGE_MODEL and [i["name"] for i in metadata["inputs"]] == ["image", "pixels"]
    not_loaded = call(model_ready, name=IMAGE_MODEL)
    assert not_loaded.status_code == 400 and json.loads(not_loaded.body) == {"name": IMAGE_MODEL, "ready": False}
    pool.close()


@pytest.fixture(scope="module")
def server():
    cfg = parse_config({"device": "cpu", "serve": {"max_delay_ms": 2, "warmup_batches": 1, "decode_threads": 2}})
    running = start_server(repo=exported_repo(), cfg=cfg, port=0, device=DeviceChoice("cpu", None, "t"), grpc_port=0)
    yield running
    running.stop()


@pytest.mark.live
def test_every_protocol_reaches_the_batcher_through_the_data_plane(server, monkeypatch):
    import tritonclient.grpc as tgrpc

    plane = server.server.config.app.state.plane
    batcher = plane.state.models[IMAGE_MODEL].batcher
    callers: list[str] = []
    submit = batcher.submit

    def spy(items):
        caller = sys._getframe(1).f_code
        callers.append(f"{Path(caller.co_filename).name}:{caller.co_qualname}")
        return submit(items)

    monkeypatch.setattr(batcher, "submit", spy)

    rest = httpx.post(
        f"{server.url}/v1/models/{IMAGE_MODEL}/predict", content=JPEG, headers={"content-type": "image/jpeg"}
    )
    assert rest.status_code == 200, rest.text
    image = {"name": "image", "datatype": "BYTES", "shape": [1], "data": [base64.b64encode(JPEG).decode()]}
    doc = {"inputs": [image], "outputs": [{"name": "logits"}]}
    kserve = httpx.post(f"{server.url}/v2/models/{IMAGE_MODEL}/infer", json=doc)
    assert kserve.status_code == 200, kserve.text
    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    tensor = tgrpc.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([JPEG], dtype=object))
    logits = client.infer(IMAGE_MODEL, [tensor]).as_numpy("logits")
    client.close()

    assert callers == ["_dataplane.py:Inference.infer"] * 3, callers
    np.testing.assert_allclose(logits[0], kserve.json()["outputs"][0]["data"], rtol=1e-5)
