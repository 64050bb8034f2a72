"""The one shape of a run that passes or fails: fault-injection runs and the server's load runs.

A report is a dataclass of figures whose verdict is a list of named expectations
(:meth:`Checklist.checks`), all of which must hold. It prints its figures with ``table()``, ending
with the verdict line (:meth:`Checklist.verdict`), and writes them with ``to_dict()``;
:func:`finish` is what a command does with one.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

from gpufeed.core._files import write_json

__all__ = ["Check", "Checklist", "finish"]


class Check(NamedTuple):
    """One expectation of a run.

    Attributes:
        name: The expectation, as it reads in the JSON's ``checks``.
        passed: Whether it held.
        detail: What was seen instead, for the verdict line of a failed check ('' to show ``name``).
    """

    name: str
    passed: bool
    detail: str = ""


class Checklist:
    """A report (a dataclass) whose verdict is a list of named expectations, all of which must hold."""

    def checks(self) -> list[tuple[str, bool]] | list[Check]:
        """Each expectation, and whether it held: ``(name, passed)`` pairs or :class:`Check`."""
        raise NotImplementedError

    def _checks(self) -> list[Check]:
        return [Check(*check) for check in self.checks()]

    @property
    def ok(self) -> bool:
        return all(check.passed for check in self._checks())

    def problems(self) -> list[str]:
        """What went wrong, one phrase per failed expectation (empty when the run passed)."""
        return [check.detail or check.name for check in self._checks() if not check.passed]

    def verdict(self) -> str:
        """``PASS``, or ``FAIL: `` and the problems."""
        problems = self.problems()
        return "PASS" if not problems else "FAIL: " + "; ".join(problems)

    def table(self) -> str:
        """The figures as printed, ending with the verdict."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        """The figures, each expectation's outcome (``checks``) and the verdict (``ok``), for JSON."""
        # A mixin of dataclasses: every subclass is one, which the type of ``self`` cannot say.
        figures = asdict(self)  # type: ignore[call-overload]
        return {**figures, "checks": {c.name: c.passed for c in self._checks()}, "ok": self.ok}


def finish(report: Checklist, json_path: str | Path | None = None) -> int:
    """Print ``report``, write it to ``json_path`` when given; return the exit status (1 when it failed)."""
    print(report.table())
    if json_path:
        write_json(json_path, report.to_dict())
    return 0 if report.ok else 1
