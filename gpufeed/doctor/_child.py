"""One doctor probe in its own process: ``python -m gpufeed.doctor._child PROBE '{json kwargs}'``.

Prints the probe's results as JSON after a marker line, so what a native library prints on the
same stdout cannot be mistaken for them. A crash or a hang kills only this process; the parent
(:mod:`gpufeed.doctor._run`) reports it as the probe's failure.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict

MARKER = "@@gpufeed-doctor-results@@"


def main(argv: list[str]) -> int:
    name, kwargs = argv[0], json.loads(argv[1]) if len(argv) > 1 else {}
    # Deferred: the probes import torch, DALI and onnxruntime, which only this child should load.
    from gpufeed.doctor import _placement, _probes

    probes: dict[str, Callable[..., list]] = {
        "torch": _probes.probe_torch,
        "dali-image": _probes.probe_dali_image,
        "nvdec": _probes.probe_nvdec,
        "onnxruntime": _probes.probe_onnxruntime,
        "placement": _placement.probe_placement,
    }
    probe = probes[name]
    results = probe(**kwargs)
    sys.stdout.flush()
    print(MARKER)
    print(json.dumps([asdict(r) for r in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
