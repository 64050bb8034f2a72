"""gpufeed.pipelines: DALI input pipelines and the loaders that wrap them.

Images: :class:`ImageDataset` indexes a split, :class:`ImageLoader` yields :class:`ImageBatch`
(uint8 NCHW channels_last images, labels, sample ids) decoded on the GPU with nvJPEG, or on the
CPU. Videos: :class:`VideoDataset` indexes a folder of videos and label CSVs, :class:`ClipLoader`
yields :class:`ClipBatch` (uint8 (N, 3, T, S, S) clips, per-frame and centre labels) decoded on
NVDEC, or on the CPU; :class:`VideoFrameReader` reads whole videos in order. Both loaders can
apply colour jitter, grayscale and flips inside their DALI graph (:class:`LoaderAugment`),
deterministic per (seed, epoch, sample). :func:`check_path` finds bad files before training.

Only what users call is exported here (each name is in the README's Python API section);
everything else lives in the private modules, which gpufeed's own packages import directly.

Each loader builds its DALI pipeline once and reads epoch after epoch through it. A pipeline
failure is a :class:`BadSampleError` when files are to blame (named), a :class:`PipelineError`
(DALI's own message and the likely cause) when none is.
"""

# Imported for its side effect: it registers the video checker that check_path uses for video folders.
from gpufeed.pipelines import _video_check  # noqa: F401
from gpufeed.pipelines._augment import ColourJitter, LoaderAugment, reference_augment
from gpufeed.pipelines._check import CheckReport, Finding, check_path
from gpufeed.pipelines._clip_loader import ClipBatch, ClipLoader
from gpufeed.pipelines._dataset import ImageDataset
from gpufeed.pipelines._errors import BadSampleError, DatasetError, PipelineError
from gpufeed.pipelines._frames import FrameChunk, VideoFrameReader
from gpufeed.pipelines._image_facts import ImageFacts, read_image_facts
from gpufeed.pipelines._image_verify import decode_problem
from gpufeed.pipelines._loader import ImageBatch, ImageLoader
from gpufeed.pipelines._prepare import PrepareOptions, PrepareReport, prepare_videos
from gpufeed.pipelines._videos import VideoDataset
from gpufeed.pipelines._waits import EpochWaits, measure_epoch_waits
from gpufeed.pipelines._windows import Windows, eval_windows, train_windows

__all__ = [
    "BadSampleError",
    "CheckReport",
    "ClipBatch",
    "ClipLoader",
    "ColourJitter",
    "DatasetError",
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
    "VideoDataset",
    "VideoFrameReader",
    "Windows",
    "check_path",
    "decode_problem",
    "eval_windows",
    "measure_epoch_waits",
    "prepare_videos",
    "read_image_facts",
    "reference_augment",
    "train_windows",
]
