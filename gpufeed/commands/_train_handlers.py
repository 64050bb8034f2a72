"""The handlers of ``gpufeed train`` and ``gpufeed report`` (their arguments are registered by ``train.py``).

Imported only when one of them runs, so it imports the training loop (torch, DALI) at module level.
"""

from __future__ import annotations

import argparse

from gpufeed.config import load_config
from gpufeed.core import StorageError
from gpufeed.models import list_checkpoints
from gpufeed.pipelines import BadSampleError, PipelineError
from gpufeed.train import TrainError, draw_report
from gpufeed.train import train as train_model

__all__ = ["report", "train"]


def train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    try:
        result = train_model(cfg, args.out, resume=args.resume, profile_steps=args.profile_steps)
    except (PipelineError, StorageError, BadSampleError) as err:
        # Mid-run, the data or the store failed: say where the run can go on from once it is fixed.
        written = list_checkpoints(args.out) if args.out is not None else []
        if not written:
            raise
        raise TrainError(
            f"{str(err).rstrip('.')}; the newest checkpoint is {written[-1]}: continue with --resume --out {args.out}"
        ) from err
    if result.checkpoint is not None:
        print(f"\nrun folder: {result.run_dir}\nlast checkpoint: {result.checkpoint}")
    return 0


def report(args: argparse.Namespace) -> int:
    png, text = draw_report(args.run_dir, args.out, window=args.window)
    print(text)
    print(f"\nreport written to {png}")
    return 0
