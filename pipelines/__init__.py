"""gpufeed.pipelines: DALI input pipelines and the loaders that wrap them.

Images: :class:`ImageDataset` indexes a split, :class:`ImageLoader` yields :class:`ImageBatch`
(uint8 NCHW channels_last images, labels, sample ids) decoded on the GPU with nvJPEG, or on the
CPU. Videos: :class:`VideoDataset` indexes a folder of videos and label CSVs, :class:`ClipLoader`
yields :class:`ClipBatch` (uint8 (N, 3, T, S, S) clips, per-frame and centre labels) decoded on
NVDEC, or on the CPU; :class:`VideoFrameReader` reads whole videos in order. Both loaders can
apply colour jitter, grayscale and flips inside their DALI graph (:class:`LoaderAugment`),
deterministic per (seed, epoch, sample). :func:`check_path` finds bad files before training.

Each loader builds its DALI pipeline once and reads epoch after epoch through it. A pipeline
failure is a :class:`BadSampleError` when files are to blame (named), a :class:`PipelineError`
(DALI's own message and the likely cause) when none is.
"""

from gpufeed.pipelines._augment import (
    AugmentRows,
    ColourJitter,
    LoaderAugment,
    colour_coefficients,
    colour_matrices,
    reference_augment,
)
from gpufeed.pipelines._check import CHECKERS, CheckReport, Finding, check_images, check_path
from gpufeed.pipelines._clip_loader import ClipBatch, ClipLoader, choose_decoder
from gpufeed.pipelines._clips import ClipGeometry, ClipTable
from gpufeed.pipelines._dataset import IMAGE_EXTENSIONS, ImageDataset, parse_list_line
from gpufeed.pipelines._epochs import default_num_threads
from gpufeed.pipelines._errors import BadSampleError, DatasetError, PipelineError
from gpufeed.pipelines._frames import FrameChunk, VideoFrameReader
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS, ImageFacts, read_image_facts
from gpufeed.pipelines._image_pipeline import decode_window
from gpufeed.pipelines._image_verify import decode_problem, find_bad_files
from gpufeed.pipelines._loader import ImageBatch, ImageLoader
from gpufeed.pipelines._prepare import PrepareOptions, PrepareReport, prepare_videos
from gpufeed.pipelines._pyav import ClipDecodeError, ClipDecoder, VideoRef
from gpufeed.pipelines._quarantine import Quarantine, read_quarantine
from gpufeed.pipelines._sampler import LAST_BATCH_POLICIES, EpochPlan, plan_epoch
from gpufeed.pipelines._video_check import check_videos
from gpufeed.pipelines._videos import (
    DALI_CPU_CODECS,
    SUPPORTED_CODECS,
    VIDEO_EXTENSIONS,
    VideoDataset,
    VideoInfo,
    probe_video,
    read_label_csv,
)
from gpufeed.pipelines._waits import EpochWaits, measure_epoch_waits
from gpufeed.pipelines._windows import Windows, eval_windows, hash_uniforms, train_windows

__all__ = [
    "CHECKERS",
    "DALI_CPU_CODECS",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "IMAGE_EXTENSIONS",
    "LAST_BATCH_POLICIES",
    "SUPPORTED_CODECS",
    "VIDEO_EXTENSIONS",
    "AugmentRows",
    "BadSampleError",
    "CheckReport",
    "ClipBatch",
    "ClipDecodeError",
    "ClipDecoder",
    "ClipGeometry",
    "ClipLoader",
    "ClipTable",
    "ColourJitter",
    "DatasetError",
    "EpochPlan",
    "EpochWaits",
    "Finding",
    "FrameChunk",
    "ImageBatch",
    "ImageDataset",
    "ImageFacts",
    "ImageLoader",
    "LoaderAugment",
    "PipelineError",
    "PrepareOptions",
    "PrepareReport",
    "Quarantine",
    "VideoDataset",
    "VideoFrameReader",
    "VideoInfo",
    "VideoRef",
    "Windows",
    "check_images",
    "check_path",
    "check_videos",
    "choose_decoder",
    "colour_coefficients",
    "colour_matrices",
    "decode_problem",
    "decode_window",
    "default_num_threads",
    "eval_windows",
    "find_bad_files",
    "hash_uniforms",
    "measure_epoch_waits",
    "parse_list_line",
    "plan_epoch",
    "prepare_videos",
    "probe_video",
    "read_image_facts",
    "read_label_csv",
    "read_quarantine",
    "reference_augment",
    "train_windows",
]
