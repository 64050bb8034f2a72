"""gpufeed.train: the training loop fed by the gpufeed loaders.

``train(cfg, run_dir)`` trains ``cfg.model`` with batches from :class:`gpufeed.pipelines.ImageLoader`
(or ``ClipLoader`` for clip models), augmentation split between the loader's DALI graph and the
device (:func:`plan_augmentation`), AMP and AdamW, measuring loader wait against compute every
step (Prometheus metrics, JSON lines, a summary table), with atomic checkpoints and ``torchrun``
DDP. ``draw_report(run_dir)`` plots a run. Before the first step the run folder must be writable
and hold room for two checkpoints (:mod:`gpufeed.train._preflight`); files the loaders leave out
are reported (:mod:`gpufeed.train._skipped`).

``__all__`` holds what users call, each name listed in the API reference (``docs/api/``); the
tasks, checkpoint, telemetry and summary helpers live in private modules (``_checkpoint`` and so
on). The names that gpufeed's benchmarks, reliability runs and demo use are re-exported below ``as``
themselves (not in the reference; they change with their users).
"""

from gpufeed.train._augment import Augmenter as Augmenter

# For gpufeed's own packages: the names they use from this package's private modules, re-exported
# here (``as`` marks a re-export) so no package reaches into another's ``_*`` modules. Not in the
# API reference; they may change with the code that uses them.
from gpufeed.train._augment import AugmentPlan as AugmentPlan
from gpufeed.train._augment import KorniaStage as KorniaStage
from gpufeed.train._augment import build_augmenter as build_augmenter
from gpufeed.train._augment import plan_augmentation
from gpufeed.train._dense import DepthTask as DepthTask
from gpufeed.train._dense import refuse_device_geometry as refuse_device_geometry
from gpufeed.train._errors import TrainError
from gpufeed.train._loop import TrainResult
from gpufeed.train._optim import build_optimizer as build_optimizer
from gpufeed.train._optim import build_scheduler as build_scheduler
from gpufeed.train._optim import compile_model as compile_model
from gpufeed.train._optim import resolve_amp as resolve_amp
from gpufeed.train._preflight import estimate_checkpoint_bytes as estimate_checkpoint_bytes
from gpufeed.train._profiling import parse_profile_steps as parse_profile_steps
from gpufeed.train._report import draw_report
from gpufeed.train._session import train
from gpufeed.train._step import Stepper as Stepper
from gpufeed.train._summary import HOST_LAUNCH as HOST_LAUNCH
from gpufeed.train._summary import STAGES as STAGES
from gpufeed.train._summary import summarize as summarize
from gpufeed.train._tasks import ClipTask as ClipTask
from gpufeed.train._tasks import ImageTask as ImageTask
from gpufeed.train._tasks import to_channels_last as to_channels_last
from gpufeed.train._timeline import Finished as Finished
from gpufeed.train._timeline import StepTimeline as StepTimeline

__all__ = ["TrainError", "TrainResult", "draw_report", "plan_augmentation", "train"]
