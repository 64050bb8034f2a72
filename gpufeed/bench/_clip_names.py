"""The names ``gpufeed bench clips`` knows (readers, generated sets), importable without numpy, torch or DALI.

The command line lists them as choices, and ``gpufeed --help`` must stay light.
"""

from __future__ import annotations

__all__ = ["CONTENDERS", "GENERATED_SETS", "STORE_SETS", "TORCHCODEC_READERS"]

TORCHCODEC_READERS = ("torchcodec_exact", "torchcodec_approximate", "torchcodec_sampler")
CONTENDERS = ("gpufeed", "decode_from_start", "opencv_seek", *TORCHCODEC_READERS)
GENERATED_SETS = ("long_gop", "prepared", "single_gop", "camera", "frame_folder", "hdf5")
STORE_SETS = {"frame_folder": "folder", "hdf5": "hdf5"}
