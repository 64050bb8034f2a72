"""gpufeed.train: the training loop fed by the gpufeed loaders.

``train(cfg, run_dir)`` trains ``cfg.model`` with batches from :class:`gpufeed.pipelines.ImageLoader`
(or ``ClipLoader`` for clip models), augmentation split between the loader's DALI graph and the
device (:func:`plan_augmentation`), AMP and AdamW, measuring loader wait against compute every
step (Prometheus metrics, JSON lines, a summary table), with atomic checkpoints and ``torchrun``
DDP. ``draw_report(run_dir)`` plots a run. Before the first step the run folder must be writable
and hold room for two checkpoints (:mod:`gpufeed.train.preflight`); files the loaders leave out
are reported (:mod:`gpufeed.train.skipped`).

Only what users call is exported here, each name listed in the README's Python API section; the
tasks, checkpoint, telemetry and summary helpers are imported from their modules
(``gpufeed.train.checkpoint`` and so on).
"""

from gpufeed.train.augment import plan_augmentation
from gpufeed.train.errors import TrainError
from gpufeed.train.loop import TrainResult
from gpufeed.train.report import draw_report
from gpufeed.train.session import train

__all__ = ["TrainError", "TrainResult", "draw_report", "plan_augmentation", "train"]
