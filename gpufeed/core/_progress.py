"""Progress of long commands: a bar on a terminal, a plain line every few seconds anywhere else.

A tqdm bar redraws itself with carriage returns, ten times a second: on a terminal that is one
line that moves; in a file, a CI log or a container log every redraw is kept, and one
``gpufeed bench clips`` log held about 1,500 of them. :func:`progress_bar` is the one place every
command gets its progress display from (bench, train, prepare, check, synth, reliability):

* ``bar``: tqdm's bar, when the output is a terminal;
* ``lines``: one plain line (``prepare: 5120/14400 frame (36%), 512 frame/s, 10 s``) at most every
  ``GPUFEED_PROGRESS_INTERVAL_S`` seconds (default 10) and one when the task ends, when the
  output is not a terminal (a file, a pipe) or ``CI`` is set;
* ``off``: nothing.

``GPUFEED_PROGRESS`` (``auto``, ``bar``, ``lines``, ``off``) overrides the choice. Tasks shorter
than the interval write no line at all. The object returned answers the part of tqdm's interface
gpufeed uses (iteration, ``update``, ``n``, ``total``, ``set_description``, ``set_postfix_str``,
``refresh``, ``close``, ``with``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

__all__ = ["PROGRESS_MODES", "LineProgress", "progress_bar", "progress_mode"]

PROGRESS_MODES = ("auto", "bar", "lines", "off")
_DEFAULT_INTERVAL_S = 10.0


def progress_mode(stream: IO[str] | None = None, environ: dict[str, str] | None = None) -> str:
    """``bar``, ``lines`` or ``off`` for output to ``stream`` (default stderr), from ``GPUFEED_PROGRESS``.

    Raises:
        ValueError: ``GPUFEED_PROGRESS`` holds a value other than :data:`PROGRESS_MODES`.
    """
    env = os.environ if environ is None else environ
    wanted = env.get("GPUFEED_PROGRESS", "auto").strip().lower() or "auto"
    if wanted not in PROGRESS_MODES:
        raise ValueError(f"GPUFEED_PROGRESS={wanted!r} is not allowed; allowed: {', '.join(PROGRESS_MODES)}")
    if wanted != "auto":
        return wanted
    stream = sys.stderr if stream is None else stream
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: no bar
        terminal = False
    return "bar" if terminal and not env.get("CI") else "lines"


def _interval_s(environ: dict[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get("GPUFEED_PROGRESS_INTERVAL_S", "")
    try:
        value = float(raw) if raw else _DEFAULT_INTERVAL_S
    except ValueError:
        raise ValueError(f"GPUFEED_PROGRESS_INTERVAL_S={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"GPUFEED_PROGRESS_INTERVAL_S={raw!r} must be above 0")
    return value


class LineProgress:
    """tqdm's interface, writing one plain line at most every ``interval_s`` seconds (see the module docs).

    Args:
        iterable: Items to yield while counting them (or ``None``: count with :meth:`update`).
        total: Items expected (``None``: unknown, no percentage).
        desc, unit: What is counted, as tqdm's.
        initial: The count to start from (a resumed epoch).
        interval_s: Least time between two lines.
        stream: Where lines go (default stderr).
        clock: Seconds, monotonic (a test passes its own).
    """

    def __init__(
        self,
        iterable: Iterable | None = None,
        *,
        total: float | None = None,
        desc: str = "",
        unit: str = "it",
        initial: float = 0,
        interval_s: float = _DEFAULT_INTERVAL_S,
        stream: IO[str] | None = None,
        clock=time.monotonic,
    ) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.desc, self.unit = total, desc, unit
        self.n = initial
        self.interval_s = interval_s
        self.stream = stream
        self.clock = clock
        self.postfix = ""
        self.lines_written = 0
        self._start = self._last = clock()
        self._initial = initial
        self._closed = False

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("this progress counts with update(); it was given no iterable")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        self.refresh()

    def set_description(self, desc: str = "", refresh: bool = True) -> None:
        self.desc = desc
        if refresh:
            self.refresh()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s
        if refresh:
            self.refresh()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.set_postfix_str(", ".join(f"{k}={v}" for k, v in items.items()), refresh)

    def refresh(self) -> None:
        """Write a line if the last one is at least ``interval_s`` old."""
        now = self.clock()
        if not self._closed and now - self._last >= self.interval_s:
            self._write(now)

    def close(self) -> None:
        """End the task: a last line when it wrote any (or lasted past the interval), so the log shows its end."""
        if self._closed:
            return
        now = self.clock()
        if self.lines_written or now - self._start >= self.interval_s:
            # Short of its total, the task was left (Ctrl-C, an error): its last line must not say done.
            self._write(now, done=self.total is None or self.n >= self.total)
        self._closed = True

    def line(self, now: float | None = None) -> str:
        """The text of a progress line at ``now`` (default: the clock's time)."""
        now = self.clock() if now is None else now
        elapsed = max(now - self._start, 1e-9)
        count = f"{self.n:g}" if self.total is None else f"{self.n:g}/{self.total:g}"
        parts = [f"{self.desc}: {count} {self.unit}" if self.desc else f"{count} {self.unit}"]
        if self.total:
            parts[0] += f" ({100 * self.n / self.total:.0f}%)"
        parts.append(f"{(self.n - self._initial) / elapsed:.3g} {self.unit}/s")
        parts.append(f"{elapsed:.0f} s")
        if self.postfix:
            parts.append(self.postfix)
        return ", ".join(parts)

    def _write(self, now: float, done: bool | None = None) -> None:
        stream = sys.stderr if self.stream is None else self.stream
        stream.write(self.line(now) + {True: " (done)", False: " (stopped)", None: ""}[done] + "\n")
        stream.flush()
        self._last = now
        self.lines_written += 1


class _Silent(LineProgress):
    """Counts and writes nothing (``GPUFEED_PROGRESS=off``, or ``disable=True``)."""

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        self._closed = True


def progress_bar(
    iterable: Iterable | None = None,
    *,
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    disable: bool = False,
    leave: bool = False,
    initial: float = 0,
    stream: IO[str] | None = None,
    **bar_options: Any,
):
    """A progress display for a long task: a tqdm bar on a terminal, else plain lines (see the module docs).

    Args:
        iterable, total, desc, unit, initial: As tqdm's.
        disable: Show nothing.
        leave: Keep the bar on the terminal when done (bars only; a line display always ends with one line).
        stream: Where it writes (default stderr).
        **bar_options: Passed to tqdm when a bar is drawn (``dynamic_ncols`` ...).
    """
    mode = "off" if disable else progress_mode(stream)
    if mode == "bar":
        from tqdm import tqdm

        return tqdm(
            iterable, total=total, desc=desc, unit=unit, leave=leave, initial=initial, file=stream, **bar_options
        )
    kind = _Silent if mode == "off" else LineProgress
    return kind(iterable, total=total, desc=desc, unit=unit, initial=initial, interval_s=_interval_s(), stream=stream)
