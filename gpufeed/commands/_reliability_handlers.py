"""The handlers of ``gpufeed reliability ...`` (their arguments are registered by ``reliability.py``).

Imported only when a run starts (the CLI resolves ``"gpufeed.commands._reliability_handlers:<name>"``),
so it imports the runs, torch, DALI and the server at module level.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from gpufeed.bench import quiet_http_logs
from gpufeed.commands import require_extra
from gpufeed.config import load_config
from gpufeed.core import finish, to_mapping
from gpufeed.reliability import (
    ServerRunReport,
    plot_soak,
    reliability_inputs,
    run_bad_data,
    run_boundary_kills,
    run_disk_faults,
    run_drain,
    run_fuzz,
    run_kill_resume,
    run_overload,
    run_soak,
)

__all__ = ["bad_data", "disk", "drain", "fuzz", "kill_resume", "overload", "resume_boundaries", "soak"]


def kill_resume(args: argparse.Namespace) -> int:
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


def resume_boundaries(args: argparse.Namespace) -> int:
    mapping = to_mapping(load_config(args.config, args.set))  # paths resolved: the runs start elsewhere
    return finish(run_boundary_kills(mapping, args.out, name=str(args.config)), args.json)


def bad_data(args: argparse.Namespace) -> int:
    return finish(run_bad_data(args.out, data=args.data), args.json)


def disk(args: argparse.Namespace) -> int:
    return finish(run_disk_faults(args.out, data=args.data), args.json)


def _server_run(
    args: argparse.Namespace,
    run: Callable[[Path, list[bytes]], ServerRunReport],
    after: Callable[[ServerRunReport], None] | None = None,
) -> int:
    """The command around a server run: its inputs, the run, the report printed and written.

    Returns:
        The exit status: 1 when an expectation failed.
    """
    require_extra("bench", f"gpufeed {args.command} {getattr(args, args.command)}")
    quiet_http_logs()
    model_dir, images = reliability_inputs(args.cache, args.model_dir)
    report = run(model_dir, images)
    status = finish(report, args.json)
    if after is not None:
        after(report)
    return status


def soak(args: argparse.Namespace) -> int:
    def plot(report: ServerRunReport) -> None:
        if args.plot:
            print(f"plot: {plot_soak(report.figures, args.plot)}")

    options = {"clients": args.clients, "seconds": args.seconds, "warmup_s": args.warmup_seconds}
    overrides, growth = tuple(args.overrides), args.max_growth
    return _server_run(
        args,
        lambda model_dir, images: run_soak(
            model_dir, images, **options, overrides=overrides, device=args.device, max_growth=growth
        ),
        after=plot,
    )


def overload(args: argparse.Namespace) -> int:
    return _server_run(
        args,
        lambda model_dir, images: run_overload(
            model_dir,
            images,
            clients=args.clients,
            seconds=args.seconds,
            queue_capacity=args.queue_capacity,
            request_timeout_s=args.request_timeout,
            overrides=tuple(args.overrides),
            device=args.device,
        ),
    )


def drain(args: argparse.Namespace) -> int:
    return _server_run(
        args,
        lambda model_dir, images: run_drain(
            model_dir, images, hold_ms=args.hold_ms, shutdown_delay_s=args.shutdown_delay, device=args.device
        ),
    )


def fuzz(args: argparse.Namespace) -> int:
    return _server_run(
        args,
        lambda model_dir, images: run_fuzz(
            model_dir, images, overrides=tuple(args.overrides), seed=args.seed, device=args.device
        ),
    )
