"""Access and limits: the optional bearer token (401 without it, for inference and admin endpoints,
never for the health probes), loopback binding by default, and the body/pixel/row limits at their
boundaries, against a real server (uvicorn on a loopback port) with real clients (httpx, tritonclient)."""

from __future__ import annotations

import io
import logging
import re
import secrets
import socket
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from _serving import IMAGE_MODEL, encode, exported_repo
from prometheus_client.parser import text_string_to_metric_families

from gpufeed.config import ServeConfig, parse_config, save_config
from gpufeed.device import DeviceChoice
from gpufeed.server import ServerStartError, start_server
from gpufeed.server._access import TOKEN_ENV, TokenError, load_token
from gpufeed.server._launch import _is_loopback

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

CPU = DeviceChoice("cpu", None, "test")
TOKEN = secrets.token_urlsafe(32)
BODY_LIMIT, PIXEL_LIMIT, ROW_LIMIT = 4096, 64 * 48, 2
PROTECTED = [
    ("GET", "/v2"),
    ("GET", f"/v2/models/{IMAGE_MODEL}"),
    ("GET", f"/v2/models/{IMAGE_MODEL}/versions/1"),
    ("GET", f"/v2/models/{IMAGE_MODEL}/ready"),
    ("GET", "/v2/models/nope/ready"),
    ("GET", "/v1/models"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("POST", f"/v2/models/{IMAGE_MODEL}/infer"),
    ("POST", f"/v2/models/{IMAGE_MODEL}/versions/1/infer"),
    ("POST", f"/v1/models/{IMAGE_MODEL}/predict"),
    ("GET", "/no/such/path"),
]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def jpeg_of_size(pixels: np.ndarray, size: int) -> bytes:
    """A valid JPEG of exactly ``size`` bytes: a comment segment after SOI takes up the slack."""
    jpeg = encode(pixels)
    pad = size - len(jpeg) - 4
    assert 0 <= pad <= 65533, (len(jpeg), size)
    return jpeg[:2] + b"\xff\xfe" + struct.pack(">H", pad + 2) + b"g" * pad + jpeg[2:]


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def guarded(token_file):
    cfg = parse_config(
        {
            "device": "cpu",
            "serve": {
                "auth_token_file": str(token_file),
                "max_delay_ms": 2,
                "warmup_batches": 1,
                "max_body_bytes": BODY_LIMIT,
                "max_image_pixels": PIXEL_LIMIT,
                "max_images_per_request": ROW_LIMIT,
            },
        }
    )
    running = start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU)
    yield running
    running.stop()


def _errors(url: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", headers=AUTH).text):
        for s in family.samples:
            if s.name == "gpufeed_server_errors_total":
                out[(s.labels["model"], s.labels["reason"])] = s.value
            if s.name == "gpufeed_server_requests_total":
                out[(s.labels["model"], s.labels["protocol"], s.labels["code"])] = s.value
    return out


def test_health_probes_need_no_token(guarded):
    assert httpx.get(guarded.url + "/v2/health/live").status_code == 200
    assert httpx.get(guarded.url + "/v2/health/ready").json() == {"ready": True}


@pytest.mark.parametrize(("method", "path"), PROTECTED, ids=[f"{m} {p}" for m, p in PROTECTED])
def test_everything_else_needs_the_token(guarded, method, path):
    before = _errors(guarded.url)
    url = guarded.url + path
    for headers, challenge in (
        ({}, 'Bearer realm="gpufeed"'),
        ({"Authorization": "Bearer " + TOKEN[:-1]}, 'Bearer realm="gpufeed", error="invalid_token"'),
        ({"Authorization": "Bearer " + TOKEN + "x"}, 'Bearer realm="gpufeed", error="invalid_token"'),
        ({"Authorization": TOKEN}, 'Bearer realm="gpufeed"'),
        ({"Authorization": "Basic " + TOKEN}, 'Bearer realm="gpufeed"'),
        ({"Authorization": "Bearer"}, 'Bearer realm="gpufeed"'),
    ):
        response = httpx.request(method, url, headers=headers, content=b"{}")
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["www-authenticate"] == challenge
        assert response.json()["reason"] == "unauthorized" and "token" in response.json()["error"].lower()
        assert TOKEN not in response.text
    after = _errors(guarded.url)
    model = IMAGE_MODEL if f"/{IMAGE_MODEL}" in path else "unknown"
    assert after[(model, "unauthorized")] == before.get((model, "unauthorized"), 0) + 6
    if path.endswith(("/infer", "/predict")):
        protocol = "kserve" if path.endswith("/infer") else "rest"
        assert after[(model, protocol, "401")] == before.get((model, protocol, "401"), 0) + 6
    # The right token, scheme in any case: no longer a 401.
    for scheme in ("Bearer", "bearer", "BEARER"):
        response = httpx.request(method, url, headers={"Authorization": f"{scheme} {TOKEN}"}, content=b"{}")
        assert response.status_code != 401, response.text


def test_the_right_token_gets_answers_and_tritonclient_can_send_it(guarded):
    image = encode(np.full((48, 64, 3), 120, np.uint8))
    response = httpx.post(
        f"{guarded.url}/v1/models/{IMAGE_MODEL}/predict", content=image, headers={**AUTH, "content-type": "image/jpeg"}
    )
    assert response.status_code == 200 and len(response.json()["predictions"]) == 1
    client = triton.InferenceServerClient(guarded.url.removeprefix("http://"))
    tensor = triton.InferInput("image", [1], "BYTES").set_data_from_numpy(np.array([image], dtype=object))
    logits = client.infer(IMAGE_MODEL, [tensor], headers=dict(AUTH)).as_numpy(
        "logits"
    )  # tritonclient adds to the dict it is given
    assert logits.shape == (1, 4)
    assert client.is_server_ready()  # the probe is open
    with pytest.raises(triton.InferenceServerException) as info:
        client.infer(IMAGE_MODEL, [tensor])
    assert info.value.status() == "401" and "Authorization" in info.value.message()
    assert client.get_model_metadata(IMAGE_MODEL, headers=dict(AUTH))["name"] == IMAGE_MODEL


def test_refused_before_the_body_is_read(guarded):
    huge = b"\xff" * (BODY_LIMIT * 16)
    path = f"{guarded.url}/v1/models/{IMAGE_MODEL}/predict"
    assert httpx.post(path, content=huge, headers={"content-type": "image/jpeg"}).status_code == 401
    assert httpx.post(path, content=huge, headers={**AUTH, "content-type": "image/jpeg"}).status_code == 413


def test_openapi_document_declares_the_bearer_scheme(guarded):
    doc = httpx.get(guarded.url + "/openapi.json", headers=AUTH).json()
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    assert doc["security"] == [{"bearer": []}]
    assert doc["paths"]["/v2/health/ready"]["get"]["security"] == []
    assert "401" in doc["paths"]["/v1/models/{name}/predict"]["post"]["responses"]


def test_schemathesis_finds_no_endpoint_that_ignores_the_token(guarded, tmp_path):
    # ignored_auth re-sends requests without (and with a wrong) token and expects 401.
    cmd = [
        str(Path(sys.executable).parent / "schemathesis"), "run", guarded.url + "/openapi.json",
        "-H", f"Authorization: Bearer {TOKEN}", "--checks", "ignored_auth,not_a_server_error",
        "--phases", "examples,fuzzing", "--max-examples", "5", "--seed", "2", "--generation-database", "none",
        "--no-color", "--output-sanitize", "true",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert "Tested: 20" in done.stdout


def test_the_token_is_never_logged_saved_or_shown(guarded, token_file, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    for headers in ({}, {"Authorization": "Bearer wrong-token-1234567890"}, AUTH):
        for path in ("/metrics", f"/v2/models/{IMAGE_MODEL}", "/openapi.json"):
            assert TOKEN not in httpx.get(guarded.url + path, headers=headers).text
    assert TOKEN not in caplog.text
    cfg = parse_config({"serve": {"auth_token_file": str(token_file)}})
    saved = save_config(cfg, tmp_path / "config.yaml").read_text()
    assert str(token_file) in saved and TOKEN not in saved, "only the file's path is configuration"


def test_token_sources_and_their_errors(tmp_path, monkeypatch):
    assert load_token(None, {}) is None
    assert load_token(None, {TOKEN_ENV: f" {TOKEN}\n"}) == TOKEN
    good = tmp_path / "good"
    good.write_text(TOKEN)
    assert load_token(good, {}) == TOKEN
    short, spaced, empty = tmp_path / "short", tmp_path / "spaced", tmp_path / "empty"
    short.write_text("s3cret")
    spaced.write_text("a token with spaces in it")
    empty.write_text("\n")
    cases = [
        (good, {TOKEN_ENV: TOKEN}, "set only one"),
        (short, {}, "at least 16 characters"),
        (spaced, {}, "at least 16 characters"),
        (empty, {}, "is empty"),
        (tmp_path / "missing", {}, "cannot read serve.auth_token_file"),
        (None, {TOKEN_ENV: "short"}, f"${TOKEN_ENV}"),
    ]
    for path, env, words in cases:
        with pytest.raises(TokenError, match=re.escape(words)) as info:
            load_token(path, env)
        assert "s3cret" not in str(info.value) and "spaces in it" not in str(info.value)
    # The environment variable alone protects a server; a bad one stops it from starting.
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    running = start_server(repo=exported_repo(), cfg=parse_config({"serve": {"warmup_batches": 1}}), port=0, device=CPU)
    try:
        assert httpx.get(running.url + "/v1/models").status_code == 401
        assert httpx.get(running.url + "/v1/models", headers=AUTH).status_code == 200
    finally:
        running.stop()
    monkeypatch.setenv(TOKEN_ENV, "short")
    with pytest.raises(ServerStartError, match="at least 16 characters"):
        start_server(repo=exported_repo(), port=0, device=CPU)
    monkeypatch.delenv(TOKEN_ENV)
    done = subprocess.run(
        [sys.executable, "-m", "gpufeed", "serve", "--model", str(exported_repo() / IMAGE_MODEL),
         "--auth-token-file", str(tmp_path / "missing"), "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "cannot read serve.auth_token_file" in done.stderr, done.stderr


def _primary_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one besides loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if _is_loopback(address) else address


def test_default_config_binds_loopback_only():
    defaults = ServeConfig()
    assert defaults.host == "127.0.0.1" and defaults.auth_token_file is None
    running = start_server(repo=exported_repo(), cfg=parse_config({"serve": {"warmup_batches": 1}}), port=0, device=CPU)
    try:
        assert running.sock.getsockname()[0] == "127.0.0.1" and running.url.startswith("http://127.0.0.1:")
        other = _primary_address()
        if other is not None:  # reachable on loopback, not on the machine's own network address
            with pytest.raises(OSError), socket.create_connection((other, running.port), timeout=5):
                pass
    finally:
        running.stop()
    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("localhost")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("10.1.2.3") and not _is_loopback("example.org")


def test_safe_default_limits():
    defaults = ServeConfig()
    assert defaults.max_body_bytes == 16 * 1024 * 1024 and defaults.max_header_bytes == 64 * 1024
    assert defaults.max_image_pixels == 40_000_000  # 8000x5000: any camera; a 100000x100000 bomb is refused
    assert defaults.max_images_per_request == 64 and defaults.queue_capacity == 256
    assert defaults.request_timeout_seconds == 30.0 and defaults.shutdown_delay_seconds == 0.0


def test_limits_hold_exactly_at_their_boundaries(guarded):
    url = f"{guarded.url}/v1/models/{IMAGE_MODEL}/predict"
    pixels = np.random.default_rng(1).integers(0, 256, (40, 50, 3), dtype=np.uint8)

    def post(body, content_type="image/jpeg", chunked=False):
        content = iter([body[: len(body) // 2], body[len(body) // 2 :]]) if chunked else body
        return httpx.post(url, content=content, headers={**AUTH, "content-type": content_type})

    for chunked in (False, True):
        assert post(jpeg_of_size(pixels, BODY_LIMIT), chunked=chunked).status_code == 200
        over = post(jpeg_of_size(pixels, BODY_LIMIT + 1), chunked=chunked)
        assert over.status_code == 413 and over.json()["reason"] == "body_too_large"
    for fmt, content_type in (("JPEG", "image/jpeg"), ("PNG", "image/png")):
        assert post(encode(np.zeros((48, 64, 3), np.uint8), fmt), content_type).status_code == 200  # 3,072 pixels
        for shape in ((48, 65, 3), (65, 48, 3)):
            refused = post(encode(np.zeros(shape, np.uint8), fmt), content_type)
            assert refused.status_code == 400 and refused.json()["reason"] == "too_many_pixels"
            assert "3,120 pixels; the limit is 3,072" in refused.json()["error"]
    small = encode(np.full((16, 16, 3), 80, np.uint8))
    files = [("image", (f"{k}.jpg", small, "image/jpeg")) for k in range(ROW_LIMIT + 1)]
    assert httpx.post(url, files=files[:ROW_LIMIT], headers=AUTH).status_code == 200
    refused = httpx.post(url, files=files, headers=AUTH)
    assert refused.status_code == 400 and "the limit is 2" in refused.json()["error"]


def test_a_body_that_never_arrives_gets_408():
    cfg = parse_config({"serve": {"warmup_batches": 1, "request_timeout_seconds": 1.0}})
    running = start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU)
    try:
        with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
            sock.sendall(
                f"POST /v1/models/{IMAGE_MODEL}/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                "Content-Length: 1000\r\n\r\n".encode()
                + b"\xff\xd8" * 10
            )  # ...and the other 980 bytes never come (a slow, "slowloris" client)
            reply = io.BytesIO()
            while b"\r\n\r\n" not in reply.getvalue() or not reply.getvalue().rstrip().endswith(b"}"):
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply.write(chunk)
        head = reply.getvalue().decode(errors="replace")
        assert head.startswith("HTTP/1.1 408") and '"reason":"timeout"' in head and "did not arrive" in head
        assert httpx.get(running.url + "/v2/health/ready").status_code == 200
    finally:
        running.stop()


def _read_answer(sock: socket.socket) -> bytes:
    """One whole HTTP response (head and Content-Length body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_request_heads_are_bounded_too():
    """serve.max_header_bytes: a 20 MB header is refused with 431 early, and the server's memory does not grow."""
    from gpufeed.reliability._serve_proc import ServeProcess

    with ServeProcess(exported_repo() / IMAGE_MODEL, ["serve.warmup_batches=1"]) as server:
        rss_before = server.rss_bytes()
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
                try:
                    for _ in range(40):
                        sock.sendall(b"X-Big: " + b"b" * (500 * 1024) + b"\r\n")
                except OSError:  # the server closed the connection after its answer: expected
                    pass
                answer = _read_answer(sock)
            assert answer.startswith(b"HTTP/1.1 431") and b'"reason":"malformed_request"' in answer
        assert server.rss_bytes() - rss_before < 20 * 1024 * 1024, "100 MB of headers were not buffered"
        fine = httpx.get(server.url + "/v2/health/live", headers={"X-Fine": "f" * 60_000})
        assert fine.status_code == 200, "a 60 KB head is under the 64 KiB default"
        body = b"\xff" * 100_000  # a whole request in one read (uvloop reads 256 KiB): its body is no head
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(
                f"POST /v1/models/{IMAGE_MODEL}/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            answer = _read_answer(sock)
        assert answer.startswith(b"HTTP/1.1 400") and b'"reason":"corrupt_image"' in answer, answer
        errors = _errors(server.url)  # (the Authorization header is ignored by a server without a token)
        assert errors[("unknown", "malformed_request")] == 5
