"""``gpufeed demo`` (the whole job on the embedded default) and ``gpufeed config``."""

from __future__ import annotations

import argparse
from pathlib import Path

# Every gpufeed call imports this module to register its arguments; the handlers, which import the
# libraries they run, are in _demo_handlers.py (torch, DALI, the server) and _config_handlers.py (the
# config schema; `gpufeed config` runs without DALI and onnxruntime).


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the main job end to end on generated synthetic data",
        description="Write the synthetic dataset, check it, and run every stage of gpufeed on it. "
        "Uses the GPU when one is usable, DALI's CPU mode otherwise.",
    )
    p.add_argument("--out", type=Path, default=Path("runs/demo"), help="run folder (default runs/demo)")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.set_defaults(func="gpufeed.commands._demo_handlers:demo")

    p = sub.add_parser(
        "config",
        help="validate a config file, print it resolved, or describe every key",
        description="With FILE: validate it (and any --set overrides) and print the resolved config. "
        "With --describe: list every key with its type, default and meaning.",
    )
    p.add_argument("file", nargs="?", type=Path, help="YAML config file (with --describe: a key or section)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    p.add_argument("--describe", action="store_true", help="list every config key (or those of FILE's section)")
    p.set_defaults(func="gpufeed.commands._config_handlers:config")
