"""The handler of ``gpufeed demo`` (its arguments are registered by ``run.py``).

Imported only when the command runs, so it imports the demo (torch, DALI, the server) at module level;
the demo's clients (the ``demo`` extra) load inside it, after ``require_extra``.
"""

from __future__ import annotations

import argparse

from gpufeed.commands import require_extra
from gpufeed.demo import run_demo

__all__ = ["demo"]


def demo(args: argparse.Namespace) -> int:
    require_extra("demo", "gpufeed demo")  # its clients (tritonclient, httpx), checked before any work
    run_demo(args.out, device=args.device)
    return 0
