"""gpufeed.train: the training loop fed by the gpufeed loaders.

``train(cfg, run_dir)`` trains ``cfg.model`` with batches from :class:`gpufeed.pipelines.ImageLoader`
(or ``ClipLoader`` for clip models), augmentation split between the loader's DALI graph and the
device (:func:`plan_augmentation`), AMP and AdamW, measuring loader wait against compute every
step (Prometheus metrics, JSON lines, a summary table), with atomic checkpoints and ``torchrun``
DDP. ``draw_report(run_dir)`` plots a run. Before the first step the run folder must be writable
and hold room for two checkpoints (:mod:`gpufeed.train._preflight`); files the loaders leave out
are reported (:mod:`gpufeed.train._skipped`).

Only what users call is exported here, each name listed in the API reference (``docs/api/``); the
tasks, checkpoint, telemetry and summary helpers live in private modules (``_checkpoint`` and so
on), which gpufeed's own benchmarks, reliability runs and tests import directly.
"""

from gpufeed.train._augment import plan_augmentation
from gpufeed.train._errors import TrainError
from gpufeed.train._loop import TrainResult
from gpufeed.train._report import draw_report
from gpufeed.train._session import train

__all__ = ["TrainError", "TrainResult", "draw_report", "plan_augmentation", "train"]
