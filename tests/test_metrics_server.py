"""The training metrics endpoint: a port in use (a second run with the default port) falls back to a free one.

Before, the second run on a machine stopped at start-up: "cannot serve training metrics on
127.0.0.1:9400: Address already in use".
"""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from gpufeed.train._metrics_server import MetricsServer, addr_file

pytestmark = pytest.mark.live  # it listens on sockets


def test_a_port_in_use_falls_back_to_a_free_one_and_says_where(tmp_path, caplog):
    registry = CollectorRegistry()
    Counter("gpufeed_probe", "a metric to find", registry=registry).inc()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level("WARNING", logger="gpufeed"):
            server = MetricsServer(registry, "127.0.0.1", port, tmp_path, 1)
        try:
            assert server.port not in (port, 0)
            assert addr_file(tmp_path, 1).read_text() == f"127.0.0.1:{server.port}\n"
            assert caplog.messages == [
                f"port {port} is in use (another run?): training metrics of rank 1 are served on port "
                f"{server.port} instead; set telemetry.metrics_port to choose one"
            ]
            with urllib.request.urlopen(f"http://{server.address}/metrics", timeout=10) as answer:
                assert b"gpufeed_probe_total 1.0" in answer.read()
        finally:
            server.close()


def test_an_address_that_cannot_be_bound_is_still_a_train_error(tmp_path):
    from gpufeed.train import TrainError

    with pytest.raises(
        TrainError, match=r"^cannot serve training metrics on 192\.0\.2\.1:0: .*telemetry\.metrics_port"
    ):
        MetricsServer(CollectorRegistry(), "192.0.2.1", 0, tmp_path, 0)  # TEST-NET-1: no interface has it
