"""gpufeed.pipelines: DALI input pipelines and the loaders that wrap them.

Images: :class:`ImageDataset` indexes a split, :class:`ImageLoader` yields :class:`ImageBatch`
(uint8 NCHW channels_last images, labels, sample ids) decoded on the GPU with nvJPEG, or on the
CPU. Videos: :class:`VideoDataset` indexes a folder of videos (video files, frame folders, HDF5
frame files) and label CSVs, :class:`ClipLoader`
yields :class:`ClipBatch` (uint8 (N, 3, T, H, W) clips, per-frame and centre labels) decoded on
NVDEC, or on the CPU; :class:`VideoFrameReader` reads whole videos in order, as :class:`FrameChunk`.
Both loaders can apply colour jitter, grayscale and flips inside their DALI graph
(:class:`LoaderAugment`, :class:`ColourJitter`), deterministic per (seed, epoch, sample).
Dense targets: :class:`PairedDataset` indexes RGB images with depth maps and/or masks,
:class:`DenseLoader` yields :class:`DenseBatch` (images and maps cropped, flipped and resized together).
:func:`check_path` finds bad files before training; :func:`read_image_facts` and
:func:`decode_problem` judge one image; :func:`prepare_videos` re-encodes videos for fast seeks.

Each loader builds its DALI pipeline once and reads epoch after epoch through it. A pipeline
failure is a :class:`BadSampleError` when files are to blame (named), a :class:`PipelineError`
(DALI's own message and the likely cause) when none is.

Only what users call is exported here, each name listed in the API reference (``docs/api/``);
samplers, hash helpers, checker tables and the rest live in the private ``_*`` modules, which the
other gpufeed packages import directly.
"""

from gpufeed.pipelines._augment import ColourJitter, LoaderAugment, reference_augment
from gpufeed.pipelines._check import check_path
from gpufeed.pipelines._clip_batch import ClipBatch
from gpufeed.pipelines._clip_loader import ClipLoader
from gpufeed.pipelines._dataset import ImageDataset
from gpufeed.pipelines._dense_loader import DenseBatch, DenseLoader
from gpufeed.pipelines._errors import BadSampleError, DatasetError, PipelineError
from gpufeed.pipelines._frames import FrameChunk, VideoFrameReader
from gpufeed.pipelines._image_facts import read_image_facts
from gpufeed.pipelines._image_verify import decode_problem
from gpufeed.pipelines._loader import ImageBatch, ImageLoader
from gpufeed.pipelines._pairs import PairedDataset
from gpufeed.pipelines._prepare import PrepareOptions, prepare_videos
from gpufeed.pipelines._videos import VideoDataset
from gpufeed.pipelines._waits import measure_epoch_waits

# Imported for its side effect: it adds the video checker to check_path's table, so every use of
# gpufeed.pipelines (any of its modules imports this package first) checks videos too.
from gpufeed.pipelines import _video_check  # noqa: F401  # isort: skip

# Likewise the paired (dense-target) checker: split roots with rgb/ and depth/ or mask/.
from gpufeed.pipelines import _pair_check  # noqa: F401  # isort: skip

# And the checkers of one file: a video or frame store named directly, an image of another format.
from gpufeed.pipelines import _check_files  # noqa: F401  # isort: skip

__all__ = [
    "BadSampleError",
    "ClipBatch",
    "ClipLoader",
    "ColourJitter",
    "DatasetError",
    "DenseBatch",
    "DenseLoader",
    "FrameChunk",
    "ImageBatch",
    "ImageDataset",
    "ImageLoader",
    "LoaderAugment",
    "PairedDataset",
    "PipelineError",
    "PrepareOptions",
    "VideoDataset",
    "VideoFrameReader",
    "check_path",
    "decode_problem",
    "measure_epoch_waits",
    "prepare_videos",
    "read_image_facts",
    "reference_augment",
]
