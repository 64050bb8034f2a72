"""Each rank's ``/metrics`` endpoint, and the file that says where it is.

A rank binds ``telemetry.metrics_host:metrics_port`` (+ its rank) and writes the bound address to
``RUN_DIR/metrics-rank<r>.addr``, which scrapers and ``gpufeed obs targets`` read.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

from gpufeed.core import write_atomic
from gpufeed.train._errors import TrainError

__all__ = ["MetricsServer", "addr_file"]

log = logging.getLogger("gpufeed")


def addr_file(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its bound metrics address (``host:port``)."""
    return Path(run_dir) / f"metrics-rank{rank}.addr"


class MetricsServer:
    """``/metrics`` over HTTP for one registry; the bound address is written for scrapers and tests.

    Args:
        registry: The prometheus_client registry to serve.
        host: Address to bind.
        port: Port to bind; 0 picks a free one.
        run_dir, rank: The address ``host:port`` goes to ``run_dir/metrics-rank<rank>.addr``.

    A port in use (a second run on the machine, with the default port) falls back to a free one,
    with a warning naming it: the metrics are not worth the run, and the address file says where
    they went.

    Raises:
        TrainError: The address cannot be bound at all (the message names the config key to change).
    """

    def __init__(self, registry, host: str, port: int, run_dir: Path, rank: int) -> None:
        from prometheus_client import start_http_server

        try:
            try:
                self._server, self._thread = start_http_server(port, addr=host, registry=registry)
            except OSError as err:
                if err.errno != errno.EADDRINUSE or not port:
                    raise
                self._server, self._thread = start_http_server(0, addr=host, registry=registry)
                log.warning(
                    "port %d is in use (another run?): training metrics of rank %d are served on port %d instead; "
                    "set telemetry.metrics_port to choose one",
                    port,
                    rank,
                    self._server.server_port,
                )
        except OSError as err:
            raise TrainError(
                f"cannot serve training metrics on {host}:{port}: {err.strerror or err}. "
                "Set telemetry.metrics_port to a free port, or 0 to pick one."
            ) from None
        self.host = host
        self.port = int(self._server.server_port)
        self.path = addr_file(run_dir, rank)
        write_atomic(self.path, f"{self.address}\n")  # readers never see a half-written address
        log.info("training metrics of rank %d at http://%s/metrics", rank, self.address)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
