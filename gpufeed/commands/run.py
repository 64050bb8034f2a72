"""``gpufeed demo`` (the whole job on the embedded default) and ``gpufeed config``."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufeed.commands import require_extra
from gpufeed.core import format_table, to_mapping

# Deferred imports: every gpufeed call imports this module to register its arguments, so a handler
# imports the libraries it runs (torch, DALI, yaml, the config schema) itself: `gpufeed --help` stays light.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the main job end to end on generated synthetic data",
        description="Write the synthetic dataset, check it, and run every stage of gpufeed on it. "
        "Uses the GPU when one is usable, DALI's CPU mode otherwise.",
    )
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="run folder (default runs/demo)")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.set_defaults(func=_demo)

    p = sub.add_parser(
        "config",
        help="validate a config file, print it resolved, or describe every key",
        description="With FILE: validate it (and any --set overrides) and print the resolved config. "
        "With --describe: list every key with its type, default and meaning.",
    )
    p.add_argument("file", nargs="?", type=Path, help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    p.add_argument("--describe", action="store_true", help="list every config key")
    p.set_defaults(func=_config)


def _demo(args: argparse.Namespace) -> int:
    require_extra("demo", "gpufeed demo")  # its clients (tritonclient, httpx), checked before any work
    from gpufeed.demo import run_demo

    run_demo(args.out, device=args.device)
    return 0


def _config(args: argparse.Namespace) -> int:
    import yaml

    from gpufeed.config import describe_config, load_config

    if args.describe:
        print(format_table(["key", "type", "default", "meaning"], [list(r) for r in describe_config()]))
        return 0
    cfg = load_config(args.file, args.overrides)
    print(yaml.safe_dump(to_mapping(cfg), sort_keys=False), end="")
    return 0
