"""KServe's own Python SDK as a client of gpufeed serve, run as a script in a subprocess.

kserve's generated protobuf modules and tritonclient.grpc's (which the server imports) define the
same ``inference.*`` messages under different file names; one Python process cannot load both
(the protobuf pool refuses the duplicate symbols). So the tests run this script with
``sys.executable`` and read one JSON line from its stdout.

Usage::

    python kserve_client.py rest|grpc ADDRESS MODEL MODE IMAGE_FILE...

``ADDRESS`` is ``http://host:port`` (rest) or ``host:port`` (grpc). ``MODE``: ``binary`` (numpy
BYTES, the SDK's binary data), ``base64`` (base64 strings with ``parameters.content_type`` on the
input), ``base64-request`` (the content type on the request), ``base64-bare`` (base64 strings and
no content type), ``video`` (one file: an encoded video as the clip model's ``video`` input,
binary). A bearer token is taken from ``$GPUFEED_TEST_TOKEN``. Prints
``{"logits": [[...]], "scores": [[...]]}``, or ``{"error": "...", "status": ...}`` and exits 1.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig


def _request(model: str, mode: str, blobs: list[bytes]) -> InferRequest:
    if mode == "video":  # one encoded video as the clip model's "video" BYTES input, raw bytes
        tensor = InferInput("video", [1], "BYTES")
        tensor.set_data_from_numpy(np.array(blobs[:1], dtype=object), binary_data=True)
        return InferRequest(model, [tensor])
    if mode == "binary":
        tensor = InferInput("image", [len(blobs)], "BYTES")
        tensor.set_data_from_numpy(np.array(blobs, dtype=object), binary_data=True)
        return InferRequest(model, [tensor])
    text = [base64.b64encode(b).decode() for b in blobs]
    if mode == "base64":
        tensor = InferInput("image", [len(blobs)], "BYTES", data=text, parameters={"content_type": "base64"})
        return InferRequest(model, [tensor])
    tensor = InferInput("image", [len(blobs)], "BYTES", data=text)
    if mode == "base64-request":
        return InferRequest(model, [tensor], parameters={"content_type": "base64"})
    if mode == "base64-bare":
        return InferRequest(model, [tensor])
    raise SystemExit(f"unknown mode {mode!r}")


async def _infer(protocol: str, address: str, model: str, mode: str, blobs: list[bytes]) -> dict:
    token = os.environ.get("GPUFEED_TEST_TOKEN")
    request = _request(model, mode, blobs)
    if protocol == "rest":
        client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=60))
        headers = {"authorization": f"Bearer {token}"} if token else None
        response = await client.infer(address, request, model_name=model, headers=headers)
        await client.close()
    else:
        client = InferenceGRPCClient(address, retries=2, timeout=60)
        headers = (("authorization", f"Bearer {token}"),) if token else None
        response = await client.infer(request, headers=headers)
        await client.close()
    return {o.name: o.as_numpy().tolist() for o in response.outputs}


def main(argv: list[str]) -> int:
    protocol, address, model, mode, *files = argv
    blobs = [Path(f).read_bytes() for f in files]
    try:
        result = asyncio.run(_infer(protocol, address, model, mode, blobs))
    except Exception as err:  # the test reads the status and message
        status = getattr(getattr(err, "response", None), "status_code", None)
        code = getattr(err, "code", None)
        if status is None and callable(code):
            status = code().name
        print(json.dumps({"error": str(getattr(err, "details", lambda: None)() or err), "status": status}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
