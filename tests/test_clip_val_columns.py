"""Validation videos' label columns against training's: matched by name, or one error before training starts.

Evaluation compares logit ``k`` with label column ``k``. Validation CSVs naming the same behaviours
in another order used to be scored column by column (the wrong behaviours, silently); other names
failed only after a whole training epoch, with a traceback.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpufeed.config import ConfigError
from gpufeed.pipelines import VideoDataset, VideoInfo
from gpufeed.train._data import _val_columns

TRAIN = ("background", "groom", "rear", "walk")


def _videos(behaviours: tuple[str, ...], rows: np.ndarray) -> VideoDataset:
    info = VideoInfo("val/a.mp4", codec="h264", width=8, height=8, num_frames=len(rows))
    return VideoDataset(("val/a.mp4",), (info,), (rows, None), behaviours, {}, "val")


def test_the_same_behaviours_in_another_order_are_matched_by_name():
    rows = np.array([[1, 0, 0, 0], [0, 1, 0, 1]], dtype=np.uint8)  # walk, rear, groom, background
    val = _val_columns(_videos(("walk", "rear", "groom", "background"), rows), TRAIN)
    assert val.behaviours == TRAIN
    np.testing.assert_array_equal(val.labels[0], rows[:, ::-1])
    assert val.labels[1] is None, "a video without labels stays without"


def test_other_behaviours_are_one_error_naming_both_column_lists():
    rows = np.zeros((3, 3), dtype=np.uint8)
    with pytest.raises(ConfigError) as info:
        _val_columns(_videos(("sniff", "dig", "climb"), rows), TRAIN)
    message = str(info.value)
    assert "\n" not in message and message.startswith("config key 'video.val': label columns")
    assert "['sniff', 'dig', 'climb'] of the videos in val differ from the training videos'" in message
    assert str(list(TRAIN)) in message


def test_matching_columns_and_unlabelled_videos_are_left_alone():
    same = _videos(TRAIN, np.zeros((2, 4), dtype=np.uint8))
    assert _val_columns(same, TRAIN) is same
    none = _videos((), np.zeros((2, 0), dtype=np.uint8))
    assert _val_columns(none, TRAIN) is none, "no usable label file: the loader names the videos and why"
