"""The LitServe baseline: LitServe's dynamic batching, PIL decoding in ``decode_request``.

LitServe gathers up to ``max_batch_size`` requests or waits ``batch_timeout``; decoding happens
per request with PIL in its inference worker. A graph exported at several batch sizes has a
symbolic batch dimension, so LitServe runs each batch as it comes (what a LitServe user would do
with a dynamic-batch export); a graph fixed at one size N is fed batches padded to N, padding rows
dropped::

    python -m gpufeed.bench.peers.litserve_peer --model-dir MODEL_DIR --port 8102 --max-delay-ms 5
"""

from __future__ import annotations

import argparse

import litserve as ls
import numpy as np

from gpufeed.bench.peers._common import onnx_session, pil_preprocess, top_k_reply
from gpufeed.models import read_model_card

__all__ = ["OnnxImageAPI", "main"]


class OnnxImageAPI(ls.LitAPI):
    """PIL decode per request, batches as they come (padded to N for a fixed-size graph), softmax top-5 replies."""

    def __init__(self, model_dir: str, device: str = "cpu", **kwargs) -> None:
        super().__init__(**kwargs)
        self.model_dir, self.device_kind = model_dir, device

    def setup(self, device) -> None:
        self.card = read_model_card(self.model_dir)
        self.session = onnx_session(f"{self.model_dir}/model.onnx", self.device_kind)
        self.fixed = isinstance(self.session.get_inputs()[0].shape[0], int)

    def decode_request(self, request):
        upload = request["image"]
        data = upload.file.read() if hasattr(upload, "file") else bytes(upload)
        return pil_preprocess(data, self.card.spec.size_px, self.card.spec.eval_crop_fraction)

    def batch(self, inputs):
        rows = np.stack(inputs)
        if not self.fixed:
            return rows, len(rows)
        padded = np.zeros((self.card.batch_size, *rows.shape[1:]), np.uint8)
        padded[: len(rows)] = rows
        return padded, len(rows)

    def predict(self, batch):
        padded, count = batch
        return self.session.run(None, {self.card.input_name: padded})[0][:count]

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return top_k_reply(output, self.card.labels)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="gpu: onnxruntime's CUDA provider")
    parser.add_argument("--port", type=int, default=8102)
    parser.add_argument("--max-delay-ms", type=float, default=5.0)
    args = parser.parse_args(argv)
    card = read_model_card(args.model_dir)
    api = OnnxImageAPI(
        args.model_dir,
        args.device,
        max_batch_size=card.batch_size,
        batch_timeout=args.max_delay_ms / 1000.0,
        api_path="/predict",
    )
    server = ls.LitServer(
        api, accelerator="cuda" if args.device == "gpu" else "cpu", devices=1, workers_per_device=1, timeout=60
    )
    print(f"listening on http://{args.host}:{args.port}", flush=True)
    server.run(host=args.host, port=args.port, generate_client_file=False, log_level="warning")


if __name__ == "__main__":
    main()
