"""The demo's dense stage on the synthetic pairs: checked, trained, exported, served as a 16-bit PNG."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from gpufeed.demo import demo_config, run_dense_demo
from gpufeed.device import DeviceChoice

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]


def test_dense_demo_stage_trains_exports_and_serves_a_depth_png(synth_dir, tmp_path, capsys):
    shutil.copytree(synth_dir / "dense", tmp_path / "data" / "dense")
    cfg = demo_config(tmp_path, "cpu")
    figures = run_dense_demo(tmp_path, cfg, DeviceChoice("cpu", None, "test"))
    out = capsys.readouterr().out
    assert "final evaluation: abs_rel" in out and "delta1" in out
    depth = np.asarray(Image.open(figures["png"]))
    assert depth.dtype == np.uint16 and depth.shape == (72, 96)  # the served image's own size, 16-bit
    assert figures["shape"] == [72, 96] and (tmp_path / "models" / "depth" / "model_card.json").exists()
