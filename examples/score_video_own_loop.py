"""Per-frame behaviour probabilities of a video with your own model call: the sequential reader and score_frames.

    python examples/score_video_own_loop.py runs/clips/checkpoints/ckpt-000000100.pt mouse.mp4 --hop-frames 1

The video (an mp4/avi/..., a frame folder or an HDF5 frame file) is read once, in order (NVDEC on a
GPU, PyAV on a CPU); windows of the model's clip slide over it, and each frame gets the mean
probabilities of the windows covering it: what `gpufeed predict` writes, from your own loop.
"""

import argparse

import torch

from gpufeed.device import resolve_device
from gpufeed.models import WindowPlan, load_model, score_frames
from gpufeed.pipelines import VideoFrameReader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a clip model's checkpoint or run folder")
    parser.add_argument("video", help="video file, frame folder or HDF5 frame file")
    parser.add_argument("--hop-frames", type=int, default=1, help="frames between window starts")
    args = parser.parse_args()

    device = resolve_device("auto")
    model = load_model(args.checkpoint).eval().to(device.torch_device)
    spec = model.spec
    reader = VideoFrameReader(args.video, size_px=spec.size_px, chunk_frames=64, device=device)
    plan = WindowPlan(spec.clip_length_frames, hop_frames=args.hop_frames)

    def logits(clips: torch.Tensor):  # (N, 3, T, H, W) uint8 on the device -> (N, classes) on the host
        with torch.inference_mode():
            return model(clips).float().cpu().numpy()

    frames = reader.info.num_frames
    top = {}
    blocks = score_frames(reader, frames, plan, logits, spec.head.class_scores, batch_windows=8)
    for block in blocks:  # frames in order, as soon as no later window covers them
        for i, row in enumerate(block.probabilities, start=block.first_frame):
            best = int(row.argmax())
            print(f"frame {i}: {spec.labels[best]} {row[best]:.6f}")
            top[spec.labels[best]] = top.get(spec.labels[best], 0) + 1
    print(f"scored {frames} frames in {plan.window_count(frames)} windows of {plan.clip_length_frames}: {top}")


if __name__ == "__main__":
    main()
