"""The handlers of ``gpufeed train`` and ``gpufeed report`` (their arguments are registered by ``train.py``).

Imported only when one of them runs, so it imports the training loop (torch, DALI) at module level.
"""

from __future__ import annotations

import argparse

from gpufeed.config import load_config
from gpufeed.train import draw_report
from gpufeed.train import train as train_model

__all__ = ["report", "train"]


def train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    result = train_model(cfg, args.out, resume=args.resume, profile_steps=args.profile_steps)
    if result.checkpoint is not None:
        print(f"\nrun folder: {result.run_dir}\nlast checkpoint: {result.checkpoint}")
    return 0


def report(args: argparse.Namespace) -> int:
    png, text = draw_report(args.run_dir, args.out, window=args.window)
    print(text)
    print(f"\nreport written to {png}")
    return 0
