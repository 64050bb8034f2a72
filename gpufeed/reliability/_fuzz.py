"""``gpufeed reliability fuzz``: send the malformed-request corpus to a real ``gpufeed serve`` and judge every answer.

Each :class:`~gpufeed.reliability._corpus.Probe` goes out byte for byte as generated (``http.client``
keeps raw paths such as ``/v1/models/../x/predict`` as they are; httpx would normalise them) on a
keep-alive connection. An answer passes when it is not a 5xx, has a status the probe allows, is a
JSON ``{"error", "reason"}`` with the expected reason and an error message that names the problem
(one of the probe's words, at most 1,000 characters). A probe marked ``may_decode`` may also get
200. After each category, and at the end, a valid request must still be answered correctly: a
JPEG gets the scores it got before the corpus, and a UINT8 tensor gets exactly the logits
onnxruntime computes for it directly. Finally the metrics must account for every answer: each
reason the responses gave counted once in ``gpufeed_server_errors_total``, and each answer to an
inference path (corpus and checks alike) counted with its status in
``gpufeed_server_requests_total`` (431s excepted: those heads never reach the app, and are counted
by reason only). :func:`run_fuzz` then measures liveness while large bodies are refused
(:mod:`gpufeed.reliability._liveness`).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufeed.config import parse_config
from gpufeed.core import Check, format_table, progress_bar
from gpufeed.models import read_model_card
from gpufeed.reliability._corpus import Probe, Target, malformed_corpus
from gpufeed.reliability._liveness import liveness_lines, measure_liveness
from gpufeed.reliability._serve_proc import ServeProcess
from gpufeed.reliability._server_runs import ServerRunReport, exit_check
from gpufeed.server import route_of

__all__ = ["FUZZ_LIMITS", "FuzzReport", "ValidRequestCheck", "run_corpus", "run_fuzz", "valid_request_check"]

# The limits the fuzzing server runs with: small enough that oversized probes stay cheap.
FUZZ_LIMITS = {"max_body_bytes": 256 * 1024, "max_image_pixels": 4_000_000, "max_images_per_request": 8}
MAX_MESSAGE_CHARS = 1000


class RawClient:
    """One keep-alive HTTP/1.1 connection that sends requests exactly as given."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None, timeout_s: float = 60.0):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.headers = dict(headers or {})
        self.conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def request(self, method, path, body=b"", headers=(), chunked=False) -> tuple[int, dict[str, str], bytes]:
        """Status, lower-cased headers and body; raises ``OSError``/``http.client.HTTPException`` without one."""
        for reused in (self.conn is not None, False):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            all_headers = {**self.headers, **dict(headers)}
            try:
                if chunked:
                    pieces = iter([body[i : i + 65536] for i in range(0, len(body), 65536)])
                    self.conn.request(method, path, body=pieces, headers=all_headers, encode_chunked=True)
                else:
                    self.conn.request(method, path, body=body, headers=all_headers)
                response = self.conn.getresponse()
                data = response.read()
                return response.status, {k.lower(): v for k, v in response.getheaders()}, data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if not reused:  # a fresh connection that fails is a real failure
                    raise
        raise AssertionError("unreachable")


def _verdict(probe: Probe, status: int, body: bytes) -> tuple[str, str | None, str]:
    """(verdict, reason given, message); verdict "ok" or "decoded" passes."""
    if status >= 500:
        return "server_error", None, body[:200].decode(errors="replace")
    if status == 200 and probe.may_decode:
        return "decoded", None, ""
    try:
        doc = json.loads(body)
        message, reason = doc["error"], doc.get("reason")
    except (ValueError, KeyError, TypeError):
        return "no_json_error", None, body[:200].decode(errors="replace")
    if status not in probe.statuses:
        return "wrong_status", reason, message
    if reason not in probe.reasons:
        return "wrong_reason", reason, message
    if not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS:
        return "bad_message", reason, str(message)[:200]
    if probe.words and not any(w.lower() in message.lower() for w in probe.words):
        return "unnamed_problem", reason, message
    return "ok", reason, message


def _metric_totals(host: str, port: int, headers: dict[str, str] | None) -> tuple[Counter[str], Counter[int]]:
    """(errors by reason, inference requests by status code) from ``/metrics``, summed over models."""
    from prometheus_client.parser import text_string_to_metric_families

    client = RawClient(host, port, headers)
    try:
        _, _, text = client.request("GET", "/metrics")
    finally:
        client.close()
    errors: Counter[str] = Counter()
    requests: Counter[int] = Counter()
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:  # counters of whole requests: their float values are integers
            if s.name == "gpufeed_server_errors_total":
                errors[s.labels["reason"]] += int(s.value)
            elif s.name == "gpufeed_server_requests_total":
                requests[int(s.labels["code"])] += int(s.value)
    return errors, requests


def is_inference_path(path: str) -> bool:
    """Whether the server counts an answer to ``path`` (as sent, query included) in its requests metric."""
    decoded = urllib.parse.unquote(path.partition("?")[0], errors="replace")  # as uvicorn decodes it
    return route_of(decoded)[1] is not None


def direct_logits(model_dir: Path, rows: np.ndarray) -> np.ndarray:
    """onnxruntime on the exported graph, without the server: rows padded to a fixed batch size N."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(Path(model_dir) / "model.onnx"), providers=["CPUExecutionProvider"])
    n = session.get_inputs()[0].shape[0]
    n = n if isinstance(n, int) else len(rows)  # a symbolic batch dimension takes the rows as they are
    padded = np.concatenate([rows, np.zeros((n - len(rows), *rows.shape[1:]), np.uint8)])
    return session.run(None, {session.get_inputs()[0].name: padded})[0][: len(rows)]


class ValidRequestCheck:
    """A check to run between probes: ``check()`` is ``None`` when valid requests are answered correctly, else why not.

    The UINT8 tensor request must get the logits onnxruntime gives directly; the JPEG (image
    models) must get the scores it got when this check was made, before any malformed request.
    ``answers`` counts the status codes of the inference requests the checks sent.
    """

    def __init__(self, host, port, model_dir: Path, jpeg: bytes | None, headers: dict[str, str] | None = None):
        card = read_model_card(model_dir)
        rows = np.random.default_rng(7).integers(0, 256, (1, *card.sample_shape), dtype=np.uint8)
        self.expected = direct_logits(model_dir, rows)
        doc = {"inputs": [{"name": card.input_name, "datatype": "UINT8", "shape": list(rows.shape),
                           "data": rows.ravel().tolist()}], "outputs": [{"name": "logits"}]}  # fmt: skip
        self.body, self.name, self.jpeg = json.dumps(doc).encode(), card.name, jpeg
        self.client = RawClient(host, port, headers)
        self.predict = f"/v1/models/{card.name}/predict?top_k={card.spec.num_classes}"
        self.answers: Counter[int] = Counter()
        head = card.spec.head  # the reference is a REST top-k answer: an image classifier's
        self.reference = self._jpeg_scores() if jpeg is not None and head.accepts_encoded and head.classifies else None

    def _send(self, method, path, body=b"", headers=()) -> tuple[int, bytes]:
        status, _, data = self.client.request(method, path, body, headers)
        if is_inference_path(path):
            self.answers[status] += 1
        return status, data

    def _jpeg_scores(self) -> list[float]:
        status, data = self._send("POST", self.predict, self.jpeg, {"Content-Type": "image/jpeg"}.items())
        if status != 200:
            raise RuntimeError(f"a valid JPEG got {status}: {data[:200]!r}")
        (prediction,) = json.loads(data)["predictions"]
        return [t["score"] for t in sorted(prediction["top_k"], key=lambda t: t["index"])]

    def __call__(self) -> str | None:
        try:
            status, data = self._send("GET", "/v2/health/ready")
            if status != 200:
                return f"not ready: {status} {data[:200]!r}"
            status, data = self._send("POST", f"/v2/models/{self.name}/infer", self.body)
            if status != 200:
                return f"a valid UINT8 request got {status}: {data[:200]!r}"
            got = np.array(json.loads(data)["outputs"][0]["data"], np.float32).reshape(self.expected.shape)
            if not np.allclose(got, self.expected, atol=1e-5):
                return f"a valid UINT8 request got logits {got} instead of {self.expected}"
            if self.reference is not None and not np.allclose(self._jpeg_scores(), self.reference, atol=1e-6):
                return "a valid JPEG got different scores than before the corpus"
        except (OSError, http.client.HTTPException, RuntimeError) as err:
            return f"a valid request failed: {err}"
        return None


def valid_request_check(
    host: str, port: int, model_dir: Path, jpeg: bytes | None, headers: dict[str, str] | None = None
) -> ValidRequestCheck:
    """A :class:`ValidRequestCheck` for the model in ``model_dir``."""
    return ValidRequestCheck(host, port, model_dir, jpeg, headers)


def run_corpus(
    host: str,
    port: int,
    probes: list[Probe],
    checks: list[ValidRequestCheck],
    *,
    headers: dict[str, str] | None = None,
    progress: bool = True,
) -> FuzzReport:
    """Send every probe, judge every answer, run the ``checks`` after each category; return the figures."""

    before, requests_before = _metric_totals(host, port, headers)
    checked_before = sum((c.answers for c in checks), Counter())
    client = RawClient(host, port, headers)
    categories: dict[str, dict] = {}
    statuses: Counter[int] = Counter()
    reasons: Counter[str] = Counter()
    inference_answers: Counter[int] = Counter()
    failures: list[dict] = []
    valid_failures: list[str] = []
    valid_checks = 0
    started = time.perf_counter()
    order = list(dict.fromkeys(p.category for p in probes))
    bar = progress_bar(total=len(probes), desc="fuzz corpus", unit="req", leave=False, disable=not progress)
    for category in order:
        tally = categories.setdefault(category, {"sent": 0, "statuses": Counter(), "decoded": 0, "failures": 0})
        for probe in (p for p in probes if p.category == category):
            tally["sent"] += 1
            try:
                status, _, body = client.request(probe.method, probe.path, probe.body, probe.headers, probe.chunked)
                verdict, reason, message = _verdict(probe, status, body)
            except (OSError, http.client.HTTPException) as err:
                status, verdict, reason, message = 0, "no_answer", None, f"{type(err).__name__}: {err}"
                client.close()
            if probe.close_after:
                client.close()
            statuses[status] += 1
            tally["statuses"][status] += 1
            if status and status != 431 and is_inference_path(probe.path):
                inference_answers[status] += 1
            if reason is not None:
                reasons[reason] += 1
            tally["decoded"] += verdict == "decoded"
            if verdict not in ("ok", "decoded"):
                tally["failures"] += 1
                failures.append({"category": category, "verdict": verdict, "status": status, "reason": reason,
                                 "message": message[:300], "method": probe.method, "path": probe.path[:120]})  # fmt: skip
            bar.update(1)
        problem = next((p for p in (check() for check in checks) if p is not None), None)
        valid_checks += 1
        if problem is not None:
            valid_failures.append(f"after {category}: {problem}")
    bar.close()
    client.close()
    seconds = time.perf_counter() - started
    after, requests_after = _metric_totals(host, port, headers)
    inference_answers += sum((c.answers for c in checks), Counter()) - checked_before
    counted = {r: after[r] - before[r] for r in set(after) | set(before) if after[r] != before[r]}
    requests_counted = {c: requests_after[c] - requests_before[c] for c in set(requests_after) | set(requests_before)}
    figures = {
        "requests": len(probes),
        "seconds": seconds,
        "categories": {c: {**v, "statuses": dict(sorted(v["statuses"].items()))} for c, v in categories.items()},
        "statuses": dict(sorted(statuses.items())),
        "reasons": dict(sorted(reasons.items())),
        "counted": dict(sorted(counted.items())),
        "inference_answers": dict(sorted(inference_answers.items())),
        "requests_counted": {c: n for c, n in sorted(requests_counted.items()) if n},
        "failures": failures,
        "valid_checks": valid_checks,
        "valid_failures": valid_failures,
    }
    return FuzzReport(figures)


@dataclass
class FuzzReport(ServerRunReport):
    """A corpus run's figures (module docs), and with :func:`run_fuzz` the server's exit and liveness.

    ``server_alive_after``, ``exit_status`` and ``liveness`` are judged when the figures hold them.
    """

    def checks(self) -> list[Check]:
        summary = self.figures
        failures, valid_failures = summary["failures"], summary["valid_failures"]
        kinds = Counter(f["verdict"] for f in failures)
        first = failures[0] if failures else None
        server_errors = {s: n for s, n in summary["statuses"].items() if s >= 500}
        checks = [
            Check(
                "every answer as expected", not failures, f"{len(failures)} bad answer(s) {dict(kinds)}; first: {first}"
            ),
            # Each failed valid request is its own problem, as it happened.
            Check("valid requests answered correctly", not valid_failures, "; ".join(valid_failures)),
            Check("no answer >= 500", not server_errors, f"answers >= 500: {server_errors}"),
            Check(
                "every error counted by reason",
                summary["counted"] == summary["reasons"],
                f"errors counted by the server {summary['counted']} != reasons answered {summary['reasons']}",
            ),
            Check(
                "every inference answer counted",
                summary["requests_counted"] == summary["inference_answers"],
                f"inference requests counted by the server {summary['requests_counted']} != answers received "
                f"{summary['inference_answers']}",
            ),
        ]
        if "server_alive_after" in summary:
            alive = summary["server_alive_after"]
            checks.append(Check("server alive after the corpus", alive, "the server died during the corpus"))
        if "exit_status" in summary:
            checks.append(exit_check(summary["exit_status"]))
        if "liveness" in summary:
            live = summary["liveness"]
            checks.append(
                Check(
                    "live while large bodies are refused",
                    live["ok"],
                    f"liveness under {live['target_ms']:.0f} ms failed (slowest answer "
                    f"{live['under_load']['max_ms']:.1f} ms, bodies answered {live['bodies_answered']})",
                )
            )
        return checks

    def lines(self) -> list[str]:
        summary = self.figures
        rows = []
        for category, tally in summary["categories"].items():
            shown = ", ".join(f"{k}: {v}" for k, v in tally["statuses"].items())
            rows.append([category, tally["sent"], shown, tally["decoded"], tally["failures"]])
        lines = [
            f"\nfuzz corpus: {summary['requests']:,} malformed requests in {summary['seconds']:.1f} s "
            f"({summary['requests'] / summary['seconds']:,.0f} req/s), valid request checked "
            f"{summary['valid_checks']} times",
            format_table(["category", "sent", "statuses", "decoded (200)", "bad answers"], rows),
            f"  statuses: {summary['statuses']}",
            f"  reasons answered: {summary['reasons']}",
            f"  counted in gpufeed_server_errors_total: {summary['counted']}",
            f"  inference answers received: {summary['inference_answers']}",
            f"  counted in gpufeed_server_requests_total: {summary['requests_counted']}",
        ]
        if "server_alive_after" in summary:
            lines.append(
                f"  server alive after the corpus: {summary['server_alive_after']}; exit status on SIGTERM "
                f"{summary['exit_status']}"
            )
        if "liveness" in summary:
            lines += liveness_lines(summary["liveness"])
        return lines


def run_fuzz(
    model_dir: Path,
    images: list[bytes],
    *,
    overrides: tuple[str, ...] = (),
    seed: int = 0,
    device: str = "cpu",
    categories: tuple[str, ...] | None = None,
    liveness: bool = True,
    progress: bool = True,
) -> FuzzReport:
    """The corpus against one ``gpufeed serve``, then (``liveness``) liveness against a second.

    Args:
        model_dir: The exported model to serve.
        images: JPEGs; the first is the valid request checked after each category.
        overrides: ``--set`` strings for both servers (after the fuzzing limits, :data:`FUZZ_LIMITS`).
        seed: The corpus seed.
        device: The servers' device.
        categories: Send only these corpus categories (default: all of them).
        liveness: Also measure liveness while large bodies are refused; it needs bodies as large as a
            real server takes, so a second server runs with the default limits.
        progress: Show a progress bar.

    Raises:
        ValueError: ``categories`` names a category the corpus does not have (the message lists them).
    """
    card = read_model_card(model_dir)
    probes = malformed_corpus([Target.from_card(card)], seed=seed, **FUZZ_LIMITS)
    if categories is not None:
        known = list(dict.fromkeys(p.category for p in probes))
        unknown = sorted(set(categories) - set(known))
        if unknown:
            raise ValueError(f"unknown fuzz categories {unknown}; the corpus has {known}")
        probes = [p for p in probes if p.category in categories]
    settings = [f"serve.{k}={v}" for k, v in FUZZ_LIMITS.items()] + ["serve.max_delay_ms=2", *overrides]
    with ServeProcess(model_dir, settings, device=device) as server:
        check = valid_request_check(server.host, server.port, model_dir, images[0])
        report = run_corpus(server.host, server.port, probes, [check], progress=progress)
        alive = server.running()
    report.figures["server_alive_after"] = alive
    report.figures["exit_status"] = server.exit_status
    if liveness:
        settings = ["serve.max_delay_ms=2", *overrides]
        limit = parse_config(None, [s for s in settings if s.startswith("serve.")]).serve.max_body_bytes
        with ServeProcess(model_dir, settings, device=device) as server:
            report.figures["liveness"] = measure_liveness(
                server.host, server.port, card.name, card.input_name, tuple(card.sample_shape), body_bytes=limit - 4096
            )
    return report
