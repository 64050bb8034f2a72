"""The handler of ``gpufeed config`` (its arguments are registered by ``run.py``).

Imported only when the command runs. ``config`` runs without DALI and onnxruntime (``cli.WITHOUT_STACK``):
it imports the config schema and YAML only.
"""

from __future__ import annotations

import argparse

import yaml

from gpufeed.config import ConfigError, describe_config, load_config
from gpufeed.core import format_table, to_mapping

__all__ = ["config"]


def config(args: argparse.Namespace) -> int:
    if args.describe:
        rows = [list(r) for r in describe_config()]
        if args.file is not None:  # `--describe train` or `--describe train.lr`: that section or key
            key = str(args.file)
            rows = [r for r in rows if r[0] == key or r[0].startswith(f"{key}.")]
            if not rows:
                raise ConfigError(key, "no config key is or starts with it (gpufeed config --describe lists them all)")
        print(format_table(["key", "type", "default", "meaning"], rows))
        return 0
    cfg = load_config(args.file, args.overrides)
    print(yaml.safe_dump(to_mapping(cfg), sort_keys=False), end="")
    return 0
