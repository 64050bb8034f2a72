"""Benchmarks: gpufeed against the baselines people use, measured in one run, printed as ratios.

Targets are checked by reading these figures, never by timed assertions in tests: shared
machines are noisy, so each benchmark interleaves its contenders and reports medians. Each
benchmark is a function taking keyword arguments and returning its figures; the ``gpufeed bench``
commands (``gpufeed.commands.bench``) print and write them. Pass/fail fault and load runs of the
server (soak, overload, drain, fuzz) are :mod:`gpufeed.reliability`.
"""

# For gpufeed's own packages: the names they use from this package's private modules, re-exported
# here (``as`` marks a re-export) so no package reaches into another's ``_*`` modules. Not in the
# API reference; they may change with the code that uses them. Nothing here loads torch or DALI:
# `gpufeed --help` imports this package for the clip names (the train report's printers are
# gpufeed.bench.train's).
from gpufeed.bench._clip_names import CONTENDERS as CONTENDERS
from gpufeed.bench._clip_names import GENERATED_SETS as GENERATED_SETS
from gpufeed.bench._common import quiet_http_logs as quiet_http_logs
from gpufeed.bench._loadgen import run_load as run_load
from gpufeed.bench._perf_analyzer import print_perf_analyzer_points as print_perf_analyzer_points
