"""gpufeed.predict: per-frame class probabilities for every frame of every video (``gpufeed predict``).

:func:`load_predictor` loads a checkpoint or an exported model folder (onnxruntime, the server's
runner) as a :class:`Predictor`; a checkpoint runs on onnxruntime too on a CPU, through its export
made once and cached (PyTorch on a GPU, or with ``runtime="torch"``); :func:`predict_videos` scores
a video, a folder of videos (encoded files, frame folders, HDF5 frame stores) or a DeepEthogram
project with a clip model and writes one ``<name>_predictions.csv`` (or DeepEthogram's ``<name>_outputs.h5``) per video, resuming
where a run stopped; :func:`predict_images` scores a folder of images with an image model, one row
per image. A rerun keeps an output (a row) only when the same model wrote it, as
``.gpufeed-predict.json`` beside the outputs records (the model's SHA-256, class names and clip
settings); the rest is scored. Both return a :class:`PredictReport`. The windows and the rule that gives each frame its
probabilities are :class:`gpufeed.models.WindowPlan` and :func:`gpufeed.models.score_frames`, which
the server's video input runs too; with a window at every frame, a stacked-frame model on
onnxruntime's CPU provider scores runs of windows that share its first convolution (about 1.6x
fewer CPU milliseconds a frame, the same probabilities within 1e-6). A checkpoint's exports are kept in a cache bounded in size
(least recently used removed first); :func:`list_export_cache` and :func:`prune_export_cache` look
at it and clean it (``gpufeed cache``).

This package sits beside ``bench`` and ``reliability`` (above the server, whose onnxruntime
runner and image decoder it uses), below the command line.
"""

# A name imported ``as`` itself is for gpufeed's own packages: one they use from this package's private
# modules, re-exported here so no package reaches into another's ``_*`` modules. Not in the API
# reference; they may change with the code that uses them.
from gpufeed.predict._cache_entries import ENV_EXPORT_CACHE_MAX_MB as ENV_EXPORT_CACHE_MAX_MB
from gpufeed.predict._cache_entries import (
    ExportCacheEntry,
    ExportCacheListing,
    ExportCachePrune,
    list_export_cache,
    prune_export_cache,
)
from gpufeed.predict._cache_entries import export_cache_max_bytes as export_cache_max_bytes
from gpufeed.predict._export_cache import default_export_cache as default_export_cache
from gpufeed.predict._images import predict_images
from gpufeed.predict._inputs import find_videos as find_videos
from gpufeed.predict._model import RUNTIMES, ParityError, Predictor, default_batch_size, load_predictor
from gpufeed.predict._outputs import read_predictions_csv as read_predictions_csv
from gpufeed.predict._run import PredictReport, VideoResult, predict_videos

__all__ = [
    "RUNTIMES",
    "ExportCacheEntry",
    "ExportCacheListing",
    "ExportCachePrune",
    "ParityError",
    "PredictReport",
    "Predictor",
    "VideoResult",
    "default_batch_size",
    "list_export_cache",
    "load_predictor",
    "predict_images",
    "predict_videos",
    "prune_export_cache",
]
