"""Training commands: ``train`` (the loop, also under torchrun) and ``report`` (a run's PNG)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufeed.commands.serve import _positive

# Every gpufeed call imports this module to register its arguments; the handlers, which import the
# libraries they run (torch, DALI, matplotlib), are in _train_handlers.py.


def _profile_steps(text: str) -> tuple[int, int]:
    # Deferred: argparse calls this while parsing `--profile-steps A:B`, and gpufeed.train loads torch
    # and DALI, which `gpufeed --help` must not.
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
    p.set_defaults(func="gpufeed.commands._train_handlers:train")

    p = sub.add_parser(
        "report",
        help="draw a PNG of loader wait against compute over a training run",
        description="Read RUN_DIR/steps*.jsonl and draw each step's loader wait, augmentation and compute, "
        "and the loader-wait share per rank; print the summary table.",
    )
    p.add_argument("run_dir", type=Path, help="a training run folder")
    p.add_argument("--out", type=Path, help="PNG to write (default RUN_DIR/report.png)")
    p.add_argument(
        "--window", type=_positive, default=10, help="steps in the rolling mean of the wait share (default 10)"
    )
    p.set_defaults(func="gpufeed.commands._train_handlers:report")
