"""The served contenders of ``gpufeed bench predict``: the same videos posted to a gpufeed server.

A server is started in the benchmark's own process (:func:`gpufeed.server.start_server`, a free
port) on the benchmark's ``gpufeed export`` folder, once as configured by default (with a window
at every frame, runs of windows on the CPU: :mod:`gpufeed.server._video_runs`) and once with
``serve.video_window_runs: false`` (every window through the batcher). A timed call posts every
video as a client would (``POST /v1/models/NAME/predict``, the file as a ``video/mp4`` body, the
hop as ``hop_frames``) and writes each answer's per-frame scores as a ``<name>_predictions.csv``,
so the run's agreement check reads them beside ``gpufeed predict``'s. The server's threads run in
the benchmark's process, so its CPU time is counted as the other contenders' is.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from gpufeed.config import parse_config
from gpufeed.server import start_server

__all__ = ["SERVED", "SERVED_ONE_BY_ONE", "served_contenders"]

SERVED = "served video (REST)"
SERVED_ONE_BY_ONE = "served video (REST, one by one)"
# The user's own long videos stay under the server's limits (their defaults refuse past 18,000 frames).
_LIMITS = {
    "max_video_frames": 10**8,
    "max_video_seconds": 10.0**8,
    "max_video_bytes": 2**40,
    "request_timeout_seconds": 24 * 3600.0,
}


@contextmanager
def served_contenders(
    exported: Path, device, hop_frames: int, names: list[str]
) -> Iterator[dict[str, Callable[[list[Path], Path], int]]]:
    """A server of ``exported`` per contender of ``names`` (:data:`SERVED`, :data:`SERVED_ONE_BY_ONE`)
    while the block runs: per contender, ``score(videos, out) -> frames``."""
    import httpx  # the bench extra's client

    def scorer(url: str) -> Callable[[list[Path], Path], int]:
        def score(videos: list[Path], out: Path) -> int:
            frames = 0
            for video in videos:
                answer = httpx.post(
                    f"{url}/v1/models/{exported.name}/predict",
                    params={"hop_frames": hop_frames},
                    content=video.read_bytes(),
                    headers={"content-type": "video/mp4"},
                    timeout=_LIMITS["request_timeout_seconds"],
                )
                if answer.status_code != 200:
                    raise RuntimeError(f"bench predict: the server answered {video.name} with {answer.text[:300]}")
                document = answer.json()
                _write_csv(out / f"{video.stem}_predictions.csv", document["labels"], document["scores"])
                frames += len(document["scores"])
            return frames

        return score

    with ExitStack() as servers:
        contenders = {}
        for name in names:
            runs = name == SERVED
            cfg = parse_config({"serve": {**_LIMITS, "video_window_runs": runs}})
            server = start_server(model=exported, cfg=cfg, port=0, device=device)
            servers.callback(server.stop)
            contenders[name] = scorer(server.url)
        yield contenders


def _write_csv(path: Path, labels: list[str], scores: list[list[float]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["frame", *labels])
        writer.writerows([k, *row] for k, row in enumerate(scores))
