"""Benchmarks: gpufeed against the baselines people use, measured in one run, printed as ratios.

Targets are checked by reading these figures, never by timed assertions in tests: shared
machines are noisy, so each benchmark interleaves its contenders and reports medians.
"""
