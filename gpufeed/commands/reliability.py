"""``gpufeed reliability ...``: fault-injection runs that print figures (training: kill-resume, bad-data, disk)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufeed._report import finish

# Deferred imports: every gpufeed call imports this module to register its arguments, so a handler
# imports the libraries it runs (torch, DALI) itself: `gpufeed --help` stays light.


def _common(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=Path("runs/reliability") / name,
        help=f"work folder (default runs/reliability/{name})",
    )
    p.add_argument("--data", type=Path, help="an existing 'gpufeed synth' folder (default: write one into --out)")
    p.add_argument("--json", type=Path, help="also write the figures here")


def register(sub: argparse._SubParsersAction) -> None:
    rel = sub.add_parser("reliability", help="fault-injection runs that prove what training promises, with figures")
    kinds = rel.add_subparsers(dest="reliability", metavar="RUN", required=True)

    p = kinds.add_parser(
        "kill-resume",
        help="kill -9 a CPU training run at random moments, resume each time, compare with an uninterrupted run",
        description="Train smallcnn on the synthetic data once without interruption, then as real 'gpufeed train' "
        "processes killed with SIGKILL at --kills moments drawn from --seed (one during a checkpoint write) and "
        "resumed with --resume each time. Prints where each kill landed, the steps redone, whether every checkpoint "
        "on disk loaded after every kill, and the largest weight difference from the uninterrupted run. "
        "Exit status 1 when a promise failed.",
    )
    _common(p, "kill-resume")
    p.add_argument("--kills", type=int, default=5, help="SIGKILLs to send (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill moments (default 0)")
    p.add_argument("--epochs", type=int, default=4, help="epochs of 6 steps (default 4)")
    p.add_argument("--checkpoint-every-steps", type=int, default=4, help="checkpoint interval (default 4)")
    p.add_argument(
        "--chunk-delay-ms",
        type=int,
        default=100,
        help="pause per 256 KiB of a checkpoint write: a slow disk (default 100)",
    )
    p.set_defaults(func=_kill_resume)

    p = kinds.add_parser(
        "bad-data",
        help="corrupt images and a truncated video: check lists them; training stops, skips or quarantines them",
        description="Damage a copy of the synthetic data (truncated JPEG, zero-byte file, non-image, corrupt PNG "
        "pixel data, truncated mp4), run 'gpufeed check' on it, then train with loader.on_bad_sample error and "
        "skip and with the quarantine list, for an image and a clip model. Prints what each run did and counted. "
        "Exit status 1 when an expectation failed.",
    )
    _common(p, "bad-data")
    p.set_defaults(func=_bad_data)

    p = kinds.add_parser(
        "disk",
        help="unwritable and full run folders: errors before training; a disk filling mid-run",
        description="Train into a path under a file, a read-only tmpfs, a 256 KiB tmpfs, and a tmpfs that fills "
        "at the third checkpoint (then grows, and --resume finishes). Needs 'unshare --mount' (root) or "
        "unprivileged user namespaces for the tmpfs cases. Exit status 1 when an expectation failed.",
    )
    _common(p, "disk")
    p.set_defaults(func=_disk)


def _kill_resume(args: argparse.Namespace) -> int:
    from gpufeed.reliability import run_kill_resume

    report = run_kill_resume(
        args.out,
        kills=args.kills,
        seed=args.seed,
        epochs=args.epochs,
        checkpoint_every_steps=args.checkpoint_every_steps,
        chunk_delay_ms=args.chunk_delay_ms,
        data=args.data,
    )
    return finish(report, args.json)


def _bad_data(args: argparse.Namespace) -> int:
    from gpufeed.reliability import run_bad_data

    return finish(run_bad_data(args.out, data=args.data), args.json)


def _disk(args: argparse.Namespace) -> int:
    from gpufeed.reliability import run_disk_faults

    return finish(run_disk_faults(args.out, data=args.data), args.json)
