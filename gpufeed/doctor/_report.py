"""What ``gpufeed doctor`` found: one result per probe, what falls back to the CPU, and the verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["STATUSES", "DoctorReport", "ProbeResult"]

# pass: it works. fail: it should work here and does not (the GPU path is broken; exit status 1).
# warn: it works, with a caveat worth acting on. absent: this GPU or build lacks it, and gpufeed
# falls back (said in the fallbacks). skip: not run (no GPU, or nothing to check).
STATUSES = ("pass", "fail", "warn", "absent", "skip")
"""A probe's possible outcomes, from best to not run."""


@dataclass
class ProbeResult:
    """One probe's outcome.

    Attributes:
        name: The probe (``driver``, ``nvjpeg``, ``nvdec-h264``, ...).
        status: One of :data:`STATUSES`.
        summary: One line for people: what was tried and what came of it.
        details: Facts behind it (versions, PSNR, timings), for ``--json``.
        fallback: When gpufeed falls back because of this (absent or failed), what it does instead.
        seconds: How long the probe took.
    """

    name: str
    status: str
    summary: str
    details: dict = field(default_factory=dict)
    fallback: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not allowed; allowed: {', '.join(STATUSES)}")


@dataclass
class DoctorReport:
    """Every probe's result, and what they add up to.

    Attributes:
        gpu: Whether an NVIDIA GPU was found (through the driver).
        require_gpu: Whether a missing GPU counts as an error (``--require-gpu``).
        results: The probes' results, in the order they are shown.
    """

    gpu: bool
    require_gpu: bool = False
    results: list[ProbeResult] = field(default_factory=list)

    @property
    def failed(self) -> list[ProbeResult]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def exit_code(self) -> int:
        """0 when the GPU path works (or there is no GPU and none is required), 1 otherwise."""
        return 1 if self.failed or (self.require_gpu and not self.gpu) else 0

    @property
    def fallbacks(self) -> list[str]:
        """What runs on the CPU (or a slower GPU path) instead, and why, one line each."""
        return [f"{r.name}: {r.fallback}" for r in self.results if r.fallback]

    def verdict(self) -> str:
        """The one line the report ends with."""
        if not self.gpu:
            line = (
                "no NVIDIA GPU on this machine: gpufeed runs on the CPU (DALI's CPU operators, onnxruntime's "
                "CPU provider, torch's CPU build)"
            )
            if self.failed:  # the CPU path's own checks (the installed set) failed: say so, not "nothing"
                return f"{line}; but {', '.join(r.name for r in self.failed)} failed"
            return line + (": a GPU was required (--require-gpu)" if self.require_gpu else "; nothing is broken")
        counts = {s: sum(r.status == s for r in self.results) for s in STATUSES}
        shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        if self.failed:
            return f"the GPU path is BROKEN: {', '.join(r.name for r in self.failed)} failed ({shown})"
        return f"the GPU path works ({shown})"

    def to_json(self) -> dict:
        return {
            "gpu": self.gpu,
            "require_gpu": self.require_gpu,
            "exit_code": self.exit_code,
            "verdict": self.verdict(),
            "results": [asdict(r) for r in self.results],
            "fallbacks": self.fallbacks,
        }

    def format_text(self) -> str:
        """The report for people: one line per probe, the fallbacks, the verdict."""
        width = max((len(r.name) for r in self.results), default=8)
        lines = ["gpufeed doctor"]
        for r in self.results:
            lines.append(f"  {r.name:<{width}}  {r.status.upper():<6}  {r.summary}")
        if self.fallbacks:
            lines.append("falls back:")
            lines.extend(f"  - {line}" for line in self.fallbacks)
        lines.append(f"result: {self.verdict()}")
        return "\n".join(lines)
