"""gpufeed.pipelines: DALI input pipelines and the loaders that wrap them.

Images: :class:`ImageDataset` indexes a split, :class:`ImageLoader` yields :class:`ImageBatch`
(uint8 NCHW channels_last images, labels, sample ids) decoded on the GPU with nvJPEG, or on the
CPU. :func:`check_path` finds bad files before training.
"""

from gpufeed.pipelines._check import CHECKERS, CheckReport, Finding, check_images, check_path
from gpufeed.pipelines._dataset import IMAGE_EXTENSIONS, ImageDataset, probe_image_file
from gpufeed.pipelines._errors import BadSampleError, DatasetError
from gpufeed.pipelines._loader import ImageBatch, ImageLoader, default_num_threads, find_bad_files
from gpufeed.pipelines._sampler import LAST_BATCH_POLICIES, EpochPlan, plan_epoch
from gpufeed.pipelines._windows import Windows, eval_windows, hash_uniforms, train_windows

__all__ = [
    "CHECKERS",
    "IMAGE_EXTENSIONS",
    "LAST_BATCH_POLICIES",
    "BadSampleError",
    "CheckReport",
    "DatasetError",
    "EpochPlan",
    "Finding",
    "ImageBatch",
    "ImageDataset",
    "ImageLoader",
    "Windows",
    "check_images",
    "check_path",
    "default_num_threads",
    "eval_windows",
    "find_bad_files",
    "hash_uniforms",
    "plan_epoch",
    "probe_image_file",
    "train_windows",
]
