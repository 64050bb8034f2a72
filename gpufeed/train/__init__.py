"""gpufeed.train: the training loop fed by the gpufeed loaders.

``train(cfg, run_dir)`` trains ``cfg.model`` with batches from :class:`gpufeed.pipelines.ImageLoader`
(or ``ClipLoader`` for clip models), augmentation split between the loader's DALI graph and the
device (:func:`plan_augmentation`), AMP and AdamW, measuring loader wait against compute every step (Prometheus metrics, JSON lines, a summary
table), with atomic checkpoints and ``torchrun`` DDP. ``draw_report(run_dir)`` plots a run.
Before the first step the run folder must be writable and hold room for two checkpoints
(:mod:`gpufeed.train.preflight`); files the loaders leave out are reported (:mod:`gpufeed.train.skipped`).
"""

from gpufeed.train.augment import Augmenter, AugmentPlan, build_augmenter, plan_augmentation
from gpufeed.train.checkpoint import capture_rng, load_latest_checkpoint, param_digest, restore_rng, save_checkpoint
from gpufeed.train.distributed import DistInfo, env_dist_info
from gpufeed.train.errors import TrainError
from gpufeed.train.loop import TrainResult
from gpufeed.train.optim import lr_factor, resolve_amp
from gpufeed.train.preflight import ensure_writable, estimate_checkpoint_bytes, space_needed
from gpufeed.train.profiling import STAGE_NAMES, parse_profile_steps
from gpufeed.train.report import draw_report
from gpufeed.train.session import train
from gpufeed.train.summary import format_summary, summarize
from gpufeed.train.tasks import Accuracy, ClipTask, ImageTask, MultiLabelF1, Task
from gpufeed.train.telemetry import STEP_FIELDS, StepRecord, TrainMetrics, addr_file, read_step_logs, step_log_path

__all__ = [
    "STAGE_NAMES",
    "STEP_FIELDS",
    "Accuracy",
    "AugmentPlan",
    "Augmenter",
    "ClipTask",
    "DistInfo",
    "ImageTask",
    "MultiLabelF1",
    "StepRecord",
    "Task",
    "TrainError",
    "TrainMetrics",
    "TrainResult",
    "addr_file",
    "build_augmenter",
    "capture_rng",
    "draw_report",
    "ensure_writable",
    "env_dist_info",
    "estimate_checkpoint_bytes",
    "format_summary",
    "load_latest_checkpoint",
    "lr_factor",
    "param_digest",
    "parse_profile_steps",
    "plan_augmentation",
    "read_step_logs",
    "resolve_amp",
    "restore_rng",
    "save_checkpoint",
    "space_needed",
    "step_log_path",
    "summarize",
    "train",
]
