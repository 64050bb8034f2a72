"""Train an image classifier in your own loop, fed by gpufeed's ImageLoader.

    python examples/train_own_loop.py photos/train --epochs 2

PHOTOS is a folder with one sub-folder of images per class (or a list file of "path label"
lines). Batches are decoded, cropped and resized by DALI: on the GPU when there is one, else on
the CPU; they arrive as uint8 (N, 3, S, S) tensors on the model's device.
"""

import argparse
import time

import torch

from gpufeed.models import create_model
from gpufeed.pipelines import ImageLoader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photos", help="class folders, or a list file")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    args = parser.parse_args()

    loader = ImageLoader(args.photos, batch_size=args.batch_size, size_px=args.size, train=True)
    classes = loader.dataset.classes
    # gpufeed's models take uint8 pixels and normalise inside; any torch model works on batch.images.float().
    model = create_model("smallcnn", num_classes=len(classes), size_px=args.size).to(loader.device.torch_device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    print(f"{len(loader.dataset)} images, {len(classes)} classes {list(classes)}, on {loader.device.describe()}")

    for epoch in range(args.epochs):
        start, seen, total = time.perf_counter(), 0, 0.0
        for batch in loader:  # one epoch
            loss = torch.nn.functional.cross_entropy(model(batch.images), batch.labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen, total = seen + len(batch), total + loss.item() * len(batch)
        rate = seen / (time.perf_counter() - start)
        print(f"epoch {epoch}: {seen} images, mean loss {total / seen:.3f}, {rate:.0f} images/s")
    loader.close()


if __name__ == "__main__":
    main()
