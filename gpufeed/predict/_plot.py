"""A video's predictions as a picture: ``<name>_predictions.png`` (``gpufeed predict --plot``).

What a behaviour lab looks at first is an ethogram: each behaviour's probability along the video,
and which one wins where. :class:`EthogramBins` collects it while the video is scored, block by
block, into at most :data:`MAX_COLUMNS` time bins (each the mean of its frames' probabilities), so
the memory is the same for a 10-second clip and a 10-hour recording; :meth:`EthogramBins.draw`
writes the picture: a heat map (one row per class, probability 0 to 1 along the frames) above a
strip of the most probable class per bin, in the class's colour, and, where the video has a label
file (:meth:`EthogramBins.set_labels`), the labels binned alike below (the share of each bin's
frames labelled with each class), so predictions and labels line up. The PNG is written beside its
output under a temporary name and renamed into place, so a half-written picture never shows.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

__all__ = ["MAX_COLUMNS", "EthogramBins", "plot_path"]

MAX_COLUMNS = 1000
"""Time bins of a picture at most: one per pixel column of the 10-inch-wide figure at 100 dpi."""


def plot_path(output: Path) -> Path:
    """Where the picture of an output (``<name>_predictions.csv`` or ``<name>_outputs.h5``) goes."""
    base = output.name
    for suffix in ("_predictions.csv", "_outputs.h5"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return output.with_name(base + "_predictions.png")


class EthogramBins:
    """Per-class mean probabilities of a video in at most ``max_columns`` time bins (see the module docs).

    Args:
        num_frames: Frames in the video.
        classes: Number of classes.
        max_columns: Bins at most; a video of fewer frames gets one bin per frame.
    """

    def __init__(self, num_frames: int, classes: int, max_columns: int = MAX_COLUMNS) -> None:
        if num_frames < 1 or classes < 1 or max_columns < 1:
            raise ValueError(
                f"num_frames {num_frames}, classes {classes}, max_columns {max_columns}: each must be >= 1"
            )
        self.num_frames = num_frames
        self.columns = min(num_frames, max_columns)
        self._sums = np.zeros((self.columns, classes), dtype=np.float64)
        self._counts = np.zeros(self.columns, dtype=np.int64)
        self.labels: np.ndarray | None = None  # (columns, classes) share of frames labelled, NaN: no column
        self.labels_name = ""

    def _bins(self, frames: np.ndarray) -> np.ndarray:
        return frames * self.columns // self.num_frames  # bins of equal size within one frame

    def add(self, first_frame: int, probabilities: np.ndarray) -> None:
        """Add the probabilities (F, classes) of frames ``first_frame .. first_frame + F - 1``."""
        frames = first_frame + np.arange(len(probabilities), dtype=np.int64)
        if len(frames) and (frames[0] < 0 or frames[-1] >= self.num_frames):
            raise ValueError(f"frames {frames[0]}..{frames[-1]} are outside 0..{self.num_frames - 1}")
        bins = self._bins(frames)
        np.add.at(self._sums, bins, np.asarray(probabilities, dtype=np.float64))
        np.add.at(self._counts, bins, 1)

    def set_labels(self, names: tuple[str, ...], labels: np.ndarray, classes: tuple[str, ...], source: str) -> int:
        """Bin a label file's (frames, K') 0/1 ``labels`` (columns ``names``) under the model's ``classes``.

        Returns:
            How many of the model's classes the file labels (0: nothing is drawn for it).
        """
        labels = np.asarray(labels)
        if len(labels) != self.num_frames:
            raise ValueError(f"{source} has {len(labels)} rows for {self.num_frames} frames")
        bins = self._bins(np.arange(self.num_frames, dtype=np.int64))
        counts = np.bincount(bins, minlength=self.columns).astype(np.float64)
        shares = np.full((self.columns, len(classes)), np.nan)
        found = 0
        for k, name in enumerate(classes):
            if name in names:
                column = labels[:, names.index(name)].astype(np.float64)
                shares[:, k] = np.bincount(bins, weights=column, minlength=self.columns) / np.maximum(counts, 1)
                found += 1
        if found:
            self.labels, self.labels_name = shares.astype(np.float32), source
        return found

    def means(self) -> np.ndarray:
        """(columns, classes) float32 mean probability per bin (NaN for a bin no frame reached)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self._sums / self._counts[:, None]).astype(np.float32)

    def draw(self, path: Path, labels: tuple[str, ...], title: str, fps: float = 0.0) -> Path:
        """Write the picture to ``path`` (atomically) and return it.

        Args:
            path: The PNG (:func:`plot_path` of the output).
            labels: Class names, in the columns' order.
            title: The figure's title (the video's name).
            fps: Frames per second: the axis is in seconds too when known.
        """
        import matplotlib

        matplotlib.use("Agg")  # no display: a file only
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap

        means = self.means()
        classes = means.shape[1]
        extent = (0.0, float(self.num_frames), classes - 0.5, -0.5)
        rows = [max(classes, 2), 1] + ([max(classes, 2)] if self.labels is not None else [])
        height = 2.2 + 0.28 * classes * (2 if self.labels is not None else 1)
        fig, axes = plt.subplots(
            len(rows), 1, figsize=(10, height), sharex=True, layout="constrained", gridspec_kw={"height_ratios": rows}
        )
        heat, strip = axes[0], axes[1]
        image = heat.imshow(
            means.T, aspect="auto", interpolation="nearest", vmin=0.0, vmax=1.0, cmap="viridis", extent=extent
        )
        heat.set_yticks(range(classes), labels)
        heat.set_title(f"{title}: per-frame probability ({self.num_frames:,} frames)", fontsize=10)
        scale = "probability" + (" (labels: share of frames)" if self.labels is not None else "")
        fig.colorbar(image, ax=list(axes), fraction=0.02, pad=0.01, label=scale)
        colours = plt.get_cmap("tab10" if classes <= 10 else "tab20")(np.arange(classes) % 20)
        winner = np.where(np.isnan(means).all(axis=1), -1, np.nanargmax(np.nan_to_num(means, nan=-1.0), axis=1))
        strip.imshow(
            np.ma.masked_less(winner, 0)[None, :],
            aspect="auto",
            interpolation="nearest",
            cmap=ListedColormap(colours),
            vmin=-0.5,
            vmax=classes - 0.5,
            extent=(0.0, float(self.num_frames), 0.5, -0.5),
        )
        strip.set_yticks([0], ["most probable"])
        if self.labels is not None:
            truth = axes[2]
            truth.imshow(
                np.ma.masked_invalid(self.labels.T), aspect="auto", interpolation="nearest", vmin=0.0, vmax=1.0,
                cmap="viridis", extent=extent,
            )  # fmt: skip
            truth.set_yticks(range(classes), labels)
            truth.set_title(f"labels ({self.labels_name})", fontsize=9)
        seconds = f" ({self.num_frames / fps:,.1f} s at {fps:g} frames/s)" if fps > 0 else ""
        axes[-1].set_xlabel(f"frame{seconds}")
        handles = [plt.Rectangle((0, 0), 1, 1, color=colours[k]) for k in range(classes)]
        fig.legend(handles, labels, loc="outside lower center", ncol=min(classes, 6), fontsize=8)
        path = Path(path)
        temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with warnings.catch_warnings():  # a name in a script the font lacks (マウス.mp4) draws as boxes
                warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from", category=UserWarning)
                fig.savefig(temporary, dpi=100, format="png")
            os.replace(temporary, path)
        finally:
            plt.close(fig)
            temporary.unlink(missing_ok=True)
        return path
