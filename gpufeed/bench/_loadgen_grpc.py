"""The closed-loop load generator of :mod:`._loadgen`, speaking KServe v2 over gRPC instead of HTTP.

C concurrent callers share one HTTP/2 channel (as gRPC clients do: streams, not connections), each
sending its next ``ModelInfer`` (one JPEG as ``raw_input_contents``, what tritonclient.grpc sends)
when the previous answer arrives. Requests are serialised once up front, so the client's cost per
call is the channel's, not protobuf's. Results are a :class:`~gpufeed.bench._loadgen.LoadResult`
with each call's gRPC status counted as the HTTP status of the same answer (200, 400, 503 ...), so
reports need not know which protocol ran.
"""

from __future__ import annotations

import asyncio
import time

from gpufeed.bench._loadgen import RESPONSE_TIMEOUT_S, LoadResult

__all__ = ["run_grpc_load"]

# gRPC status name -> the HTTP status gpufeed gives the same answer (server/_grpc.py's table).
_HTTP_STATUS = {
    "OK": 200,
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 413,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


def _requests(model: str, images: list[bytes]) -> list[bytes]:
    from tritonclient.grpc import service_pb2

    out = []
    for image in images:
        request = service_pb2.ModelInferRequest(model_name=model)
        request.inputs.add(name="image", datatype="BYTES", shape=[1])
        request.raw_input_contents.append(len(image).to_bytes(4, "little") + image)
        out.append(request.SerializeToString())
    return out


async def _caller(call, requests, offset, window, result: LoadResult, metadata, timeout_s: float) -> None:
    import grpc

    _, end = window
    k = offset
    while time.perf_counter() < end:
        payload = requests[k % len(requests)]
        k += 1
        sent = time.perf_counter()
        retry_after, reason = False, None
        try:
            await call(payload, metadata=metadata, timeout=timeout_s)
            status = 200
        except grpc.aio.AioRpcError as err:
            status = _HTTP_STATUS.get(err.code().name, 599 if err.code().name == "CANCELLED" else 500)
            reason = err.code().name.lower()
            trailing = err.trailing_metadata() or ()
            retry_after = any(key == "retry-after" for key, _ in trailing)
        done = time.perf_counter()
        result.record(status, sent, done, window, retry_after, reason)


async def _run(address, requests, concurrency, warmup_s, seconds, metadata, timeout_s) -> LoadResult:
    import grpc

    now = time.perf_counter()
    window = (now + warmup_s, now + warmup_s + seconds)
    result = LoadResult(concurrency, seconds)
    options = [("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.enable_retries", 0)]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        # Bytes in, bytes out: the payloads are serialised already and the answers are not parsed.
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None,
            response_deserializer=None,
        )
        await asyncio.gather(
            *[_caller(call, requests, k * 7, window, result, metadata, timeout_s) for k in range(concurrency)]
        )
    return result


def run_grpc_load(
    host: str,
    port: int,
    model: str,
    images: list[bytes],
    *,
    concurrency: int,
    seconds: float,
    warmup_s: float = 1.0,
    token: str | None = None,
    response_timeout_s: float = RESPONSE_TIMEOUT_S,
) -> LoadResult:
    """Drive ``ModelInfer`` of ``model`` with ``concurrency`` callers for ``warmup_s + seconds``.

    Args:
        token: Sent as metadata ``authorization: Bearer <token>`` when given.
        response_timeout_s: A call without an answer by then counts as status 504.
    """
    requests = _requests(model, images)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return asyncio.run(_run(address, requests, concurrency, warmup_s, seconds, metadata, response_timeout_s))
