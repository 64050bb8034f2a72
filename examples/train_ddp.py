"""Distributed data-parallel training with torchrun: each rank reads its own shard of the images.

    torchrun --nproc-per-node 2 examples/train_ddp.py photos/train --epochs 2

The process group is initialised before the loader is built, so ImageLoader takes this rank's
shard (rank, world size) from torch.distributed by itself. NCCL between GPUs, gloo on CPUs.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gpufeed.models import create_model
from gpufeed.pipelines import ImageLoader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photos", help="class folders, or a list file")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = ImageLoader(args.photos, batch_size=args.batch_size, size_px=args.size, train=True)
    device = loader.device
    model = create_model("smallcnn", num_classes=len(loader.dataset.classes), size_px=args.size).to(device.torch_device)
    model = DistributedDataParallel(model, device_ids=[device.device_id] if device.is_gpu else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for epoch in range(args.epochs):
        seen, ids = 0, []
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch.images), batch.labels)
            optimizer.zero_grad()
            loss.backward()  # DDP averages the gradients of every rank here
            optimizer.step()
            seen += len(batch)
            ids += batch.sample_ids.tolist()
        print(f"rank {rank} of {world}, shard {loader.shard_id}/{loader.num_shards}: {seen} images", flush=True)
        everyone = [None] * world
        dist.all_gather_object(everyone, ids)
        if rank == 0:
            read = [i for shard in everyone for i in shard]
            print(
                f"epoch {epoch}: {world} ranks read {len(read)} images, {len(set(read))} distinct, loss {loss.item():.3f}"
            )
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
