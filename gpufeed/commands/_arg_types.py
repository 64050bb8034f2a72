"""Argument types shared by the command modules' parsers."""

from __future__ import annotations

import argparse

from gpufeed.core import data_path

__all__ = ["location"]


def location(text: str) -> str:
    """A local path or an ``s3://`` URL, as given; a URL gpufeed cannot read is a usage error naming the argument."""
    try:
        data_path(text)
    except ValueError as err:  # a bad bucket name, gs:// ...: one line, not a traceback from deep in the command
        raise argparse.ArgumentTypeError(str(err)) from None
    return text
