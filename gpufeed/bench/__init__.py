"""Benchmarks: gpufeed against the baselines people use, measured in one run, printed as ratios.

Targets are checked by reading these figures, never by timed assertions in tests: shared
machines are noisy, so each benchmark interleaves its contenders and reports medians. Each
benchmark is a function taking keyword arguments and returning its figures; the ``gpufeed bench``
commands (``gpufeed.commands.bench``) print and write them. Pass/fail fault and load runs of the
server (soak, overload, drain, fuzz) are :mod:`gpufeed.reliability`.
"""
