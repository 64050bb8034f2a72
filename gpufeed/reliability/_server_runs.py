"""What the server's fault and load runs share: their inputs and their report shape.

``reliability soak``, ``overload``, ``drain`` and ``fuzz`` each drive a real ``gpufeed serve``
and return a :class:`ServerRunReport`: the run's figures (the dict its JSON holds) and the
expectations they must meet, in the one shape of every run that passes or fails
(:class:`gpufeed.core._report.Checklist`, which the training fault runs use too).
:func:`reliability_inputs` is what each command feeds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufeed.bench.server import export_bench_models
from gpufeed.core import Check, Checklist, SizePx
from gpufeed.models import read_model_card
from gpufeed.synth import make_bench_images

__all__ = ["ServerRunReport", "exit_check", "reliability_inputs"]


def reliability_inputs(
    cache: Path, model_dir: Path | None = None, images: int = 32, size: tuple[int, int] = (320, 240)
) -> tuple[Path, list[bytes]]:
    """The model and JPEGs the reliability scripts use.

    The model is ``model_dir`` if given, else ``smallcnn`` at 64 px, batch 8, fresh weights,
    exported once into ``cache``: a small model on purpose, since the scripts test the server
    (HTTP, validation, batching, decode, memory), not how fast two CPU cores run a ResNet. The
    JPEGs are photo-like, 320x240, generated once into ``cache``.
    """
    if model_dir is None:
        model_dir = export_bench_models(Path(cache), "smallcnn", SizePx(64, 64), 8, None)["batched"]
    else:
        read_model_card(model_dir)  # a wrong folder is refused before the images are written
    folder = make_bench_images(Path(cache), images, *size)
    return model_dir, [p.read_bytes() for p in sorted((folder / "photos").glob("*.jpg"))]


@dataclass
class ServerRunReport(Checklist):
    """A server run's figures and the expectations they must meet.

    Attributes:
        figures: What the run measured, as its JSON holds it (``to_dict`` adds ``checks`` and ``ok``).
    """

    figures: dict

    def lines(self) -> list[str]:
        """The figures as printed, one line each, before the verdict."""
        raise NotImplementedError

    def table(self) -> str:
        return "\n".join([*self.lines(), "  result: " + self.verdict()])

    def to_dict(self) -> dict:
        # The figures stay at the top level, where the JSON has always had them.
        return {**self.figures, "checks": {c.name: c.passed for c in self._checks()}, "ok": self.ok}


def exit_check(exit_status: int | None) -> Check:
    """The expectation every server run ends with: SIGTERM drains the server and it exits 0."""
    return Check("exit status 0 on SIGTERM", exit_status == 0, f"exit status {exit_status} after SIGTERM (expected 0)")
