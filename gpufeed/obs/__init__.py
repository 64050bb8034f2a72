"""gpufeed.obs: the monitoring stack's contract, queries and a real Prometheus to check them with.

* :data:`METRICS`: the Prometheus metric names the trainer and the server export.
* :func:`load_queries`: every PromQL expression of the Grafana dashboards and Prometheus rules
  of the monitoring stack, which ships inside the package (:func:`packaged_stack_dir`,
  ``gpufeed/obs/stack/``) and which ``docker/compose.yaml`` mounts.
* :class:`LocalPrometheus` / :class:`PrometheusAPI`: run the ``prometheus`` binary on loopback
  and query it.
* :func:`check_queries`: evaluate every query and report which error or return no data.
* :func:`file_sd_groups`: training runs' ``metrics-rank<r>.addr`` files as Prometheus targets.
* :func:`live_figures`: loader wait against compute and per-stage latency, read through PromQL.

Only these are exported (each has an entry in the API reference, ``docs/api/``); the commands, the
demo and the tests import the rest from the private modules.
"""

from gpufeed.obs._contract import METRICS, MetricSpec
from gpufeed.obs._figures import live_figures
from gpufeed.obs._prometheus import (
    LocalPrometheus,
    PrometheusAPI,
    PrometheusError,
    PrometheusNotFoundError,
    find_prometheus_binary,
)
from gpufeed.obs._queries import Query, load_queries
from gpufeed.obs._targets import MetricsAddressError, file_sd_groups

# For gpufeed's own packages: the names they use from this package's private modules, re-exported
# here (``as`` marks a re-export) so no package reaches into another's ``_*`` modules. Not in the
# API reference; they may change with the code that uses them.
from gpufeed.obs._targets import write_file_sd as write_file_sd
from gpufeed.obs._verify import QueryCheck, check_queries, packaged_stack_dir
from gpufeed.obs._verify import find_stack_dir as find_stack_dir
from gpufeed.obs._verify import format_checks as format_checks
from gpufeed.obs._watch import run_local_prometheus as run_local_prometheus
from gpufeed.obs._watch import stack_prometheus as stack_prometheus

__all__ = [
    "METRICS",
    "LocalPrometheus",
    "MetricSpec",
    "MetricsAddressError",
    "PrometheusAPI",
    "PrometheusError",
    "PrometheusNotFoundError",
    "Query",
    "QueryCheck",
    "check_queries",
    "file_sd_groups",
    "find_prometheus_binary",
    "live_figures",
    "load_queries",
    "packaged_stack_dir",
]
