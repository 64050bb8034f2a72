"""The handler of ``gpufeed synth`` (its arguments are registered by ``data.py``).

Imported only when the command runs. ``synth`` runs without DALI and onnxruntime (``cli.WITHOUT_STACK``),
so this module imports the synthetic data writer only, not the pipelines of ``check`` and ``prepare``.
"""

from __future__ import annotations

import argparse

from gpufeed.synth import SynthSpec, write_synthetic_dataset

__all__ = ["synth"]


def synth(args: argparse.Namespace) -> int:
    spec = SynthSpec(
        num_classes=args.classes,
        train_per_class=args.train_per_class,
        val_per_class=args.val_per_class,
        num_videos=args.videos,
        video_frames=tuple(args.video_frames),
        video_gop_frames=args.gop,
        paired_train=args.paired_train,
        paired_val=args.paired_val,
        paired_width=args.paired_size[0],
        paired_height=args.paired_size[1],
        seed=args.seed,
    )
    out = write_synthetic_dataset(args.out, spec)
    print(f"wrote synthetic dataset to {out}")
    return 0
