"""The hand-written baseline: FastAPI + PIL + onnxruntime, one inference per request.

What most people write first: a synchronous endpoint (FastAPI runs it on its thread pool), PIL
decode and resize, ``session.run`` on a batch of one. Serve a model exported with
``--batch-size 1``::

    python -m gpufeed.bench.peers.plain --model-dir MODEL_DIR --port 8101
"""

# No ``from __future__ import annotations`` here: FastAPI reads the endpoint's annotations at runtime.
import argparse

from fastapi import FastAPI, File, UploadFile

from gpufeed.bench.peers._common import onnx_session, pil_preprocess, top_k_reply
from gpufeed.models import read_model_card

__all__ = ["build_app", "main"]


def build_app(model_dir: str, device: str = "cpu"):
    card = read_model_card(model_dir)
    if card.batch_size != 1:
        raise SystemExit(f"the plain baseline runs one image per inference: export {model_dir} with --batch-size 1")
    session = onnx_session(f"{model_dir}/model.onnx", device)
    app = FastAPI()

    @app.get("/health")
    def health():
        return {"ok": True}

    @app.post("/predict")
    def predict(image: UploadFile = File(...)):  # noqa: B008 - FastAPI's idiom
        pixels = pil_preprocess(image.file.read(), card.spec.size_px, card.spec.eval_crop_fraction)
        logits = session.run(None, {card.input_name: pixels[None]})[0][0]
        return top_k_reply(logits, card.labels)

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="gpu: onnxruntime's CUDA provider")
    parser.add_argument("--port", type=int, default=8101)
    args = parser.parse_args(argv)
    app = build_app(args.model_dir, args.device)
    print(f"listening on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
