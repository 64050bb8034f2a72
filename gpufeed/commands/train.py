"""Training commands: ``train`` (the loop, also under torchrun) and ``report`` (a run's PNG)."""

from __future__ import annotations

import argparse
from pathlib import Path

# Deferred imports: every gpufeed call imports this module to register its arguments, so a handler
# imports the libraries it runs (torch, DALI, matplotlib) itself: `gpufeed --help` stays light.


def _profile_steps(text: str) -> tuple[int, int]:
    from gpufeed.train import parse_profile_steps

    try:
        return parse_profile_steps(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a model on DALI batches, measuring loader wait against compute",
        description="Train the config's model: DALI loader, Kornia augmentation on the device, AMP, AdamW, "
        "evaluation each epoch, atomic checkpoints, Prometheus metrics and per-step JSON lines in the run folder. "
        "Under 'torchrun --nproc-per-node N -m gpufeed train ...' every rank trains its own shard with DDP.",
    )
    p.add_argument("--config", required=True, type=Path, help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    p.add_argument("--out", type=Path, help="run folder (default runs/<model>-<date>-<time>)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument(
        "--profile-steps",
        type=_profile_steps,
        metavar="A:B",
        help="record a torch.profiler Chrome trace of steps A to B into the run folder",
    )
    p.set_defaults(func=_train)

    p = sub.add_parser(
        "report",
        help="draw a PNG of loader wait against compute over a training run",
        description="Read RUN_DIR/steps*.jsonl and draw each step's loader wait, augmentation and compute, "
        "and the loader-wait share per rank; print the summary table.",
    )
    p.add_argument("run_dir", type=Path, help="a training run folder")
    p.add_argument("--out", type=Path, help="PNG to write (default RUN_DIR/report.png)")
    p.add_argument("--window", type=int, default=10, help="steps in the rolling mean of the wait share (default 10)")
    p.set_defaults(func=_report)


def _train(args: argparse.Namespace) -> int:
    from gpufeed.config import load_config
    from gpufeed.train import train

    cfg = load_config(args.config, args.overrides)
    result = train(cfg, args.out, resume=args.resume, profile_steps=args.profile_steps)
    if result.checkpoint is not None:
        print(f"\nrun folder: {result.run_dir}\nlast checkpoint: {result.checkpoint}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from gpufeed.train import draw_report

    png, text = draw_report(args.run_dir, args.out, window=args.window)
    print(text)
    print(f"\nreport written to {png}")
    return 0
