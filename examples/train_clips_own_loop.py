"""Train a behaviour classifier on video clips in your own loop, fed by gpufeed's ClipLoader.

    python examples/train_clips_own_loop.py videos/ --epochs 2

VIDEOS holds <name>.mp4 files (or frame folders, HDF5 frame files), each with a <name>.csv of
per-frame multi-hot labels, or is a DeepEthogram project. Each clip is decoded by NVDEC on a GPU
(PyAV or DALI on the CPU); the loss is on each clip's centre-frame labels.
"""

import argparse

import torch

from gpufeed.models import create_model
from gpufeed.pipelines import ClipLoader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("videos", help="folder of labelled videos, or a DeepEthogram project")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--clip-length", type=int, default=5, help="frames per clip")
    parser.add_argument("--size", type=int, default=48, help="frame side in pixels")
    args = parser.parse_args()

    loader = ClipLoader(args.videos, batch_size=args.batch_size, clip_length_frames=args.clip_length, size_px=args.size)
    behaviours = loader.behaviours
    model = create_model(
        "r3d_small", num_classes=len(behaviours), clip_length_frames=args.clip_length, size_px=args.size
    ).to(loader.device.torch_device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    print(f"{len(loader.dataset)} videos, behaviours {list(behaviours)}, clip shape {loader.clip_shape}")

    for epoch in range(args.epochs):
        clips, total = 0, 0.0
        for batch in loader:  # batch.clips: (N, 3, T, H, W) uint8; batch.centre_labels: (N, K) multi-hot
            logits = model(batch.clips)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.centre_labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            clips, total = clips + len(batch), total + loss.item() * len(batch)
        print(f"epoch {epoch}: {clips} clips, mean loss {total / clips:.3f}")
    loader.close()


if __name__ == "__main__":
    main()
