"""The per-step plot of ``gpufeed bench train`` (``--plot``): where each step's time went, per loader run."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpufeed.bench._train_report import percent_text, rate_text
from gpufeed.train import STAGES

__all__ = ["draw_train_plot"]

_STAGE_NAMES = dict(STAGES)


def draw_train_plot(result: dict, out: str | Path) -> Path:
    """Per step, loader wait / augment / compute of each loader run, epoch starts dotted, rounds solid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sides = list(result["loaders"])
    fig, axes = plt.subplots(len(sides), 1, figsize=(11, 7 if len(sides) > 1 else 4), sharex=True, sharey=True,
                             squeeze=False)  # fmt: skip
    axes = axes[:, 0]
    colours = (("loader_wait_s", "#d62728"), ("augment_s", "#ff7f0e"), ("compute_s", "#1f77b4"))
    totals = [
        np.array([s["loader_wait_s"] + s["augment_s"] + s["compute_s"] for s in result["loaders"][side]["per_step"]])
        for side in sides
    ]
    every = np.concatenate(totals) * 1e3
    # A loader start-up can take 100x a normal step; clip it so the normal steps stay readable.
    top = float(every.max(initial=1.0)) * 1.05
    ceiling = min(top, float(np.percentile(every, 95) * 3)) if len(every) >= 10 else top
    for ax, side in zip(axes, sides, strict=True):
        figs = result["loaders"][side]
        steps = figs["per_step"]
        x = np.arange(1, len(steps) + 1)
        base = np.zeros(len(steps))
        for key, colour in colours:
            values = np.array([s[key] for s in steps]) * 1e3
            ax.bar(x, values, bottom=base, width=1.0, color=colour, label=_STAGE_NAMES[key], linewidth=0)
            base += values
        for step, s in zip(x, steps, strict=True):
            if s["batch"] == 0:
                solid = s["epoch"] == 0
                ax.axvline(
                    step - 0.5, color="black" if solid else "grey", linewidth=0.8, linestyle="-" if solid else ":"
                )
            if base[step - 1] > ceiling:
                ax.annotate(
                    f"{base[step - 1]:,.0f} ms", (step, ceiling), ha="center", va="top", fontsize=7, rotation=90
                )
        ax.set_ylim(0, ceiling)
        ax.set_ylabel("ms per step")
        ax.set_title(
            f"{result['labels'][side]}: loader wait {percent_text(figs['loader_wait_share'])} of step time "
            f"({percent_text(figs['steady_loader_wait_share'])} without epochs' first batches), "
            f"{rate_text(figs['samples_per_s'])} samples/s",
            fontsize=10,
        )
    axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("step (solid line: a round starts with a fresh loader; dotted: an epoch starts)")
    fig.suptitle(
        f"gpufeed bench train: {result['model']}, batch {result['batch_size']}, {result['machine']['device']}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
