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
"""

from gpufeed.obs._contract import (
    DCGM_METRICS,
    ERROR_REASONS,
    METRICS,
    PROTOCOLS,
    STAGES,
    MetricSpec,
    exported_series_names,
    metric_by_name,
)
from gpufeed.obs._figures import live_figures
from gpufeed.obs._prometheus import (
    LocalPrometheus,
    PrometheusAPI,
    PrometheusError,
    PrometheusNotFoundError,
    find_prometheus_binary,
    finite_values,
    free_port,
    scrape_job,
)
from gpufeed.obs._queries import (
    DEFAULT_GRAFANA_VALUES,
    Query,
    alert_signal,
    dashboard_queries,
    label_values_args,
    load_queries,
    metric_names,
    rule_queries,
    substitute,
)
from gpufeed.obs._targets import MetricsAddressError, file_sd_groups, read_metrics_addresses, write_file_sd
from gpufeed.obs._verify import (
    QueryCheck,
    check_queries,
    dcgm_scraped,
    find_stack_dir,
    format_checks,
    missing_series,
    packaged_stack_dir,
    rule_health_problems,
    stack_scrape_configs,
    variable_values,
)

__all__ = [
    "DCGM_METRICS",
    "DEFAULT_GRAFANA_VALUES",
    "ERROR_REASONS",
    "METRICS",
    "PROTOCOLS",
    "STAGES",
    "LocalPrometheus",
    "MetricSpec",
    "MetricsAddressError",
    "PrometheusAPI",
    "PrometheusError",
    "PrometheusNotFoundError",
    "Query",
    "QueryCheck",
    "alert_signal",
    "check_queries",
    "dashboard_queries",
    "dcgm_scraped",
    "exported_series_names",
    "file_sd_groups",
    "find_prometheus_binary",
    "find_stack_dir",
    "finite_values",
    "format_checks",
    "free_port",
    "label_values_args",
    "live_figures",
    "load_queries",
    "metric_by_name",
    "metric_names",
    "missing_series",
    "packaged_stack_dir",
    "read_metrics_addresses",
    "rule_health_problems",
    "rule_queries",
    "scrape_job",
    "stack_scrape_configs",
    "substitute",
    "variable_values",
    "write_file_sd",
]
