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

``__all__`` holds what users call, each name listed in the API reference (``docs/api/``);
samplers, hash helpers, checker tables and the rest live in the private ``_*`` modules. The names
that gpufeed's other packages use are re-exported below ``as`` themselves (not in the reference;
they change with their users), so no package imports another's private modules.
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

# For gpufeed's own packages: the names they use from this package's private modules, re-exported
# here (``as`` marks a re-export) so no package reaches into another's ``_*`` modules. Not in the
# API reference; they may change with the code that uses them.
from gpufeed.pipelines._augment import BASIS as BASIS
from gpufeed.pipelines._augment import DRAWS as DRAWS
from gpufeed.pipelines._augment import RowsFeed as RowsFeed
from gpufeed.pipelines._augment import augment_graph as augment_graph
from gpufeed.pipelines._augment import colour_coefficients as colour_coefficients
from gpufeed.pipelines._check import NOT_BAD as NOT_BAD
from gpufeed.pipelines._check import CheckReport as CheckReport
from gpufeed.pipelines._dataset import IMAGE_EXTENSIONS as IMAGE_EXTENSIONS
from gpufeed.pipelines._deepethogram import is_project as is_project
from gpufeed.pipelines._deepethogram import project_dataset as project_dataset
from gpufeed.pipelines._deepethogram import read_project as read_project
from gpufeed.pipelines._epochs import EpochLoader as EpochLoader
from gpufeed.pipelines._epochs import default_num_threads as default_num_threads
from gpufeed.pipelines._frame_fit import FrameFitter as FrameFitter
from gpufeed.pipelines._frame_stores import FrameBytesReader as FrameBytesReader
from gpufeed.pipelines._frame_stores import decode_frame as decode_frame
from gpufeed.pipelines._frame_stores import label_path as label_path
from gpufeed.pipelines._frame_stores import stored_colorspace as stored_colorspace
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS as DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._image_pipeline import decode_window as decode_window
from gpufeed.pipelines._image_pipeline import eval_decoder_options as eval_decoder_options
from gpufeed.pipelines._mask_check import check_mask_ids as check_mask_ids
from gpufeed.pipelines._next_phases import NEXT_PHASES as NEXT_PHASES
from gpufeed.pipelines._nvdec import nvdec_problem as nvdec_problem
from gpufeed.pipelines._pairs import is_paired_root as is_paired_root
from gpufeed.pipelines._prepare_shards import write_clip_shards as write_clip_shards
from gpufeed.pipelines._prepare_shards import write_image_shards as write_image_shards
from gpufeed.pipelines._pyav import ClipDecoder as ClipDecoder
from gpufeed.pipelines._pyav import VideoRef as VideoRef
from gpufeed.pipelines._pyav_sequential import iter_frame_chunks as iter_frame_chunks
from gpufeed.pipelines._sampler import plan_epoch as plan_epoch
from gpufeed.pipelines._shares import coverage_problem as coverage_problem
from gpufeed.pipelines._shares import share_report as share_report
from gpufeed.pipelines._split_folders import split_folders as split_folders
from gpufeed.pipelines._store_feed import jpeg_decode_sizes as jpeg_decode_sizes
from gpufeed.pipelines._store_kinds import is_frame_folder as is_frame_folder
from gpufeed.pipelines._store_kinds import store_extensions as store_extensions
from gpufeed.pipelines._video_bytes import CONTAINERS as CONTAINERS
from gpufeed.pipelines._video_bytes import VideoBytes as VideoBytes
from gpufeed.pipelines._video_bytes import first_line as first_line
from gpufeed.pipelines._video_bytes import read_in_order as read_in_order
from gpufeed.pipelines._videos import DALI_CPU_CODECS as DALI_CPU_CODECS
from gpufeed.pipelines._videos import SUPPORTED_CODECS as SUPPORTED_CODECS
from gpufeed.pipelines._videos import VIDEO_EXTENSIONS as VIDEO_EXTENSIONS
from gpufeed.pipelines._videos import VideoInfo as VideoInfo
from gpufeed.pipelines._videos import index_videos as index_videos
from gpufeed.pipelines._videos import labels_for as labels_for
from gpufeed.pipelines._videos import list_videos as list_videos
from gpufeed.pipelines._videos import raw_stream_hint as raw_stream_hint
from gpufeed.pipelines._windows import Windows as Windows
from gpufeed.pipelines._windows import eval_windows as eval_windows
from gpufeed.pipelines._windows import train_windows as train_windows

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
