"""Raw H.264 streams (a Raspberry Pi camera's .h264): named, with how to wrap them, never read as video.

Such a file has no container, so no timestamps and no index: frame rates and seeks would be
guesses. ``gpufeed check`` and ``gpufeed predict`` say what it is and give the command that wraps
it at its recording rate.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from videohelp import write_odd_video

from gpufeed.pipelines import DatasetError, check_path
from gpufeed.predict._inputs import find_videos

av = pytest.importorskip("av")


def _raw_h264(path) -> None:
    with av.open(str(path), "w", format="h264") as container:
        stream = container.add_stream("libx264", rate=Fraction(30, 1))
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for index in range(5):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), index * 40, np.uint8), format="rgb24")
            frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def test_a_folder_of_raw_streams_says_how_to_wrap_them(tmp_path):
    raw = tmp_path / "cam1.h264"
    _raw_h264(raw)
    report = check_path(tmp_path, progress=False)
    [finding] = report.findings
    assert finding.kind == "video" and "no videos" in finding.reason
    assert f"{raw} is a raw H.264/H.265 stream" in finding.reason
    assert f"ffmpeg -framerate 30 -i {raw} -c copy {tmp_path / 'cam1.mp4'}" in finding.reason

    write_odd_video(tmp_path / "clip.mp4", 0, 12)
    findings = {f.path: f for f in check_path(tmp_path, progress=False).findings}
    assert findings[str(raw)].kind == "ignored" and findings[str(raw)].reason.startswith("a raw H.264/H.265 stream")


def test_predict_names_a_raw_stream(tmp_path):
    raw = tmp_path / "cam1.h264"
    _raw_h264(raw)
    with pytest.raises(DatasetError, match=r"cam1\.h264 is a raw H\.264/H\.265 stream .* -c copy .*cam1\.mp4$"):
        find_videos(raw)
