"""Train with PyTorch Lightning's Trainer, fed by a gpufeed ImageLoader instead of a DataLoader.

    python examples/train_lightning.py photos/train --epochs 2

The loader goes to ``trainer.fit`` as it is. Its batches are already on the device (DALI decodes
them there), so the module hands them through ``transfer_batch_to_device`` unchanged.
"""

import argparse

import lightning as L
import torch

from gpufeed.models import create_model
from gpufeed.pipelines import ImageLoader


class Classifier(L.LightningModule):
    def __init__(self, num_classes: int, size_px: int) -> None:
        super().__init__()
        self.model = create_model("smallcnn", num_classes=num_classes, size_px=size_px)
        self.losses: list[float] = []

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # an ImageBatch, on the loader's device already

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.cross_entropy(self.model(batch.images), batch.labels)
        self.losses.append(loss.item())
        return loss

    def on_train_epoch_end(self) -> None:
        mean = sum(self.losses) / max(len(self.losses), 1)
        print(f"epoch {self.current_epoch}: {len(self.losses)} steps, mean loss {mean:.3f}")
        self.losses.clear()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photos", help="class folders, or a list file")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--size", type=int, default=64)
    args = parser.parse_args()

    loader = ImageLoader(args.photos, batch_size=args.batch_size, size_px=args.size, train=True)
    print(f"{len(loader.dataset)} images, {len(loader)} batches an epoch, on {loader.device.describe()}")
    module = Classifier(len(loader.dataset.classes), args.size)
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    accelerator = "gpu" if loader.device.is_gpu else "cpu"
    trainer = L.Trainer(max_epochs=args.epochs, accelerator=accelerator, devices=1, **quiet)
    trainer.fit(module, train_dataloaders=loader)
    print(f"trained {trainer.global_step} steps with Lightning")
    loader.close()


if __name__ == "__main__":
    main()
