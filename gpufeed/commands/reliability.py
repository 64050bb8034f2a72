"""``gpufeed reliability ...``: pass/fail fault and load runs that print figures.

Training: kill-resume, resume-boundaries, bad-data, disk. Serving, each against a real ``gpufeed serve``: soak,
overload, drain, fuzz (until the next release also ``gpufeed bench soak|overload|drain|fuzz``).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

from gpufeed.commands import Handler, resolve_handler

# Every gpufeed call imports this module to register its arguments; the handlers, which import the runs
# (torch, DALI, the server), are in _reliability_handlers.py, named as "module:function".


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
    rel = sub.add_parser(
        "reliability", help="pass/fail fault and load runs that prove what training and serving promise, with figures"
    )
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
    p.set_defaults(func="gpufeed.commands._reliability_handlers:kill_resume")

    p = kinds.add_parser(
        "resume-boundaries",
        help="kill -9 a training run of your config at each boundary, resume, compare bit for bit",
        description="Train --config once without interruption, then as 'gpufeed train' processes killed with "
        "SIGKILL before the first checkpoint, in the middle of an epoch after a checkpoint, and right after an "
        "end-of-epoch checkpoint, resumed with --resume each time. Prints where each resume started (the "
        "checkpoint's loader position) and whether any process of a killed run outlived it, and compares the "
        "final weights, optimizer state and every step's loss with the uninterrupted run's, bit for bit. The "
        "config needs train.checkpoint_every_steps of 2 or more that is not a multiple of the steps per epoch, "
        "and 2 or more epochs. Exit status 1 when a promise failed.",
    )
    p.add_argument("--config", type=Path, required=True, help="the training config (YAML)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument(
        "--out", type=Path, default=Path("runs/reliability/resume-boundaries"), help="work folder (replaced)"
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.set_defaults(func="gpufeed.commands._reliability_handlers:resume_boundaries")

    p = kinds.add_parser(
        "bad-data",
        help="corrupt images and a truncated video: check lists them; training stops, skips or quarantines them",
        description="Damage a copy of the synthetic data (truncated JPEG, zero-byte file, non-image, corrupt PNG "
        "pixel data, truncated mp4), run 'gpufeed check' on it, then train with loader.on_bad_sample error and "
        "skip and with the quarantine list, for an image and a clip model. Prints what each run did and counted. "
        "Exit status 1 when an expectation failed.",
    )
    _common(p, "bad-data")
    p.set_defaults(func="gpufeed.commands._reliability_handlers:bad_data")

    p = kinds.add_parser(
        "disk",
        help="unwritable and full run folders: errors before training; a disk filling mid-run",
        description="Train into a path under a file, a read-only tmpfs, a 256 KiB tmpfs, and a tmpfs that fills "
        "at the third checkpoint (then grows, and --resume finishes). Needs 'unshare --mount' (root) or "
        "unprivileged user namespaces for the tmpfs cases. Exit status 1 when an expectation failed.",
    )
    _common(p, "disk")
    p.set_defaults(func="gpufeed.commands._reliability_handlers:disk")

    register_server_runs(kinds)


# -- runs against a real server (soak, overload, drain, fuzz) ----------------------------------------


def _add_run(
    kinds: argparse._SubParsersAction,
    renamed_from: str | None,
    name: str,
    handler: str,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    if renamed_from is None:
        p = kinds.add_parser(name, help=help, description=description)
        p.set_defaults(func=handler)
        return p
    # No help=: argparse then leaves the old name out of the family's listing (help=argparse.SUPPRESS
    # would list it as "==SUPPRESS==" on Python 3.11, and the family's metavar hides the choices);
    # _ListedNames keeps it out of the "invalid choice" error too.
    names = kinds._name_parser_map
    if not isinstance(names, _ListedNames):
        names = kinds._name_parser_map = kinds.choices = _ListedNames(names)
    names.unlisted.add(name)
    p = kinds.add_parser(name, description=f"Renamed 'gpufeed reliability {name}'; this name goes in the next release. "
                         + description)  # fmt: skip
    p.set_defaults(func=_renamed(f"gpufeed {renamed_from} {name}", f"gpufeed reliability {name}", handler))
    return p


class _ListedNames(dict):
    """A family's subcommands by name where some names parse but are not listed when iterated
    (argparse's "invalid choice ... (choose from ...)" iterates them)."""

    def __init__(self, names: dict) -> None:
        super().__init__(names)
        self.unlisted: set[str] = set()

    def __iter__(self) -> Iterator[str]:
        return (name for name in super().__iter__() if name not in self.unlisted)


def _renamed(old: str, new: str, handler: str) -> Handler:
    def run(args: argparse.Namespace) -> int:
        print(f"{old}: renamed '{new}'; the old name goes in the next release", file=sys.stderr)
        return resolve_handler(handler)(args)

    return run


def _add_served_model_args(p: argparse.ArgumentParser) -> None:
    """What every server run takes: the model, the device, the cache, the JSON."""
    p.add_argument("--model-dir", type=Path, help="model folder to serve (default: smallcnn 64 px, batch 8, exported)")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="cpu", help="the server's device (default cpu)")
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where the model and images are kept")
    p.add_argument("--json", type=Path, help="write the figures here")


def _add_overrides_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="serve config")


def _add_reliability_args(p: argparse.ArgumentParser, clients: int, seconds: float) -> None:
    _add_served_model_args(p)
    _add_overrides_arg(p)
    p.add_argument("--clients", type=int, default=clients, help=f"concurrent connections (default {clients})")
    p.add_argument("--seconds", type=float, default=seconds, help=f"measured seconds (default {seconds:g})")


def register_server_runs(kinds: argparse._SubParsersAction, renamed_from: str | None = None) -> None:
    """``soak``, ``overload``, ``drain`` and ``fuzz``: pass/fail runs against a real ``gpufeed serve``.

    Args:
        kinds: The subcommands of ``gpufeed reliability`` (or of ``renamed_from``).
        renamed_from: The command family that held these runs before (``bench``): registered there
            under their old names, left out of its listing, each printing a notice naming the new command.
    """
    add = functools.partial(_add_run, kinds, renamed_from)
    p = add(
        "soak",
        "gpufeed.commands._reliability_handlers:soak",
        help="many clients for a long time against gpufeed serve: errors, RSS growth, throughput, p99",
        description="Start gpufeed serve (its own process) and drive it with CLIENTS closed-loop keep-alive connections "
        "sending multipart JPEGs for SECONDS after a warm-up. Prints throughput, p50/p99 latency, errors and the "
        "server's RSS after warm-up and at the end; exit status 1 if anything failed (errors, RSS growth >= "
        "--max-growth, not ready after, exit status != 0 on SIGTERM).",
    )
    _add_reliability_args(p, clients=64, seconds=60.0)
    p.add_argument("--warmup-seconds", type=float, default=10.0, help="load before measuring (default 10)")
    p.add_argument("--max-growth", type=float, default=0.10, help="largest RSS growth that passes (default 0.10)")
    p.add_argument("--plot", type=Path, help="draw throughput and RSS over time to this PNG")

    p = add(
        "overload",
        "gpufeed.commands._reliability_handlers:overload",
        help="far more load than capacity: bounded queue, 503 + Retry-After, bounded latency, nothing hangs",
        description="Start gpufeed serve with a small queue (--queue-capacity images) and drive it with CLIENTS "
        "closed-loop connections that never back off. Scrapes the queue depth every 50 ms. Prints offered and "
        "admitted load, the share refused with 503, admitted latency p50/p99/max, the largest queue depth seen; "
        "exit status 1 if the queue overflowed, a refusal lacked Retry-After, an admitted request exceeded the "
        "request timeout, a request went unanswered, or the server did not recover.",
    )
    _add_reliability_args(p, clients=64, seconds=10.0)
    p.add_argument("--queue-capacity", type=int, default=16, help="serve.queue_capacity (default 16 images)")
    p.add_argument("--request-timeout", type=float, default=5.0, help="serve.request_timeout_seconds (default 5)")

    p = add(
        "drain",
        "gpufeed.commands._reliability_handlers:drain",
        help="SIGTERM with requests in flight: readiness false, in-flight answered, new ones 503, exit 0",
        description="Start gpufeed serve, hold batch-size minus one requests in its batcher (a long max delay), send "
        "SIGTERM, and probe readiness and predictions during the drain. Accounts for every request sent (answered, "
        "refused at connect, dropped) and prints the exit status; exit status 1 if a request was dropped, an "
        "in-flight request lost its answer, readiness stayed true, or the server did not exit 0.",
    )
    _add_served_model_args(p)
    p.add_argument(
        "--hold-ms", type=float, default=2000.0, help="serve.max_delay_ms holding the requests (default 2000)"
    )
    p.add_argument("--shutdown-delay", type=float, default=2.0, help="serve.shutdown_delay_seconds (default 2)")

    p = add(
        "fuzz",
        "gpufeed.commands._reliability_handlers:fuzz",
        help="over a thousand malformed requests against gpufeed serve: every answer a 4xx naming the problem",
        description="Start gpufeed serve (max body 256 KiB, 4 M pixels, 8 images per request) and send the generated "
        "corpus of malformed requests (truncated, corrupt and bit-flipped JPEG/PNG, zero bytes, decompression-bomb "
        "headers, wrong content types, malformed and oversized JSON, wrong tensor shapes and dtypes, unknown, "
        "path-like and very long model names, broken multipart and query strings, wrong methods). Checks every "
        "answer (no 5xx, the expected status and reason, a message naming the problem), that valid requests are "
        "still answered correctly after each category, and that every refusal was counted by reason. Prints "
        "requests by category, status and reason; exit status 1 on any failure.",
    )
    _add_served_model_args(p)
    _add_overrides_arg(p)
    p.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
