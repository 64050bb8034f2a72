"""The collection-time checks of GPU tests (``_gpu_checks.py``) catch each kind of defect, on source text.

Each check runs on a deliberately broken example and on its fixed twin: a ``gpu`` test that starts a
server or processes without its tier mark, patches an attribute that moved, asks DALI's CPU reader
for h264, or compares two decoders' pixels exactly. The last test runs pytest on such a file, with
this suite's ``conftest.py``, and sees each broken test fail on this CPU machine instead of skipping.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _gpu_checks import Module, param_problems, problems_of
from test_tiers import SUPPORT

HERE = Path(__file__).parent


def _problems(source: str, test: str, marks=("gpu",), fixtures=(), params=None) -> list[str]:
    module = Module.parse(textwrap.dedent(source), HERE / "test_example.py")
    return problems_of(module, test, marks=set(marks), fixtures=list(fixtures), params=params)


SERVER = """
    import pytest
    from gpufeed.server import start_server

    def _serve(device):
        return start_server(repo="repo", port=0, device=device)

    @pytest.mark.gpu
    def test_serves():
        _serve("gpu").stop()
"""


def test_a_gpu_test_that_starts_a_server_needs_the_live_mark():
    (problem,) = _problems(SERVER, "test_serves")
    assert problem == ("starts a server (_serve() calls gpufeed.server.start_server) but is not marked `live`"), problem
    assert _problems(SERVER, "test_serves", marks=("gpu", "live")) == []


def test_processes_need_the_process_mark_and_a_server_fixture_the_live_one():
    source = """
        import subprocess, sys
        from gpufeed.pipelines import ClipLoader

        def test_child():
            subprocess.run([sys.executable, "-c", "pass"])

        def test_pyav(device):
            ClipLoader("videos", device=device, video_cfg=cfg(decoder="pyav"))

        def test_nvdec(device):
            ClipLoader("videos", device=device, video_cfg=cfg(decoder="dali"))

        def test_served(kserve_server):
            pass
    """
    assert _problems(source, "test_child") == [
        "starts child processes (test_child() calls subprocess.run) but is not marked `process`"
    ]
    assert "names the PyAV decoder (worker processes)" in _problems(source, "test_pyav")[0]
    assert _problems(source, "test_nvdec") == [], "NVDEC's reader starts no process"
    assert _problems(source, "test_pyav", marks=("gpu", "process")) == []
    assert _problems(source, "test_served", fixtures=["kserve_server"]) == [
        "starts a server (the kserve_server fixture (a server)) but is not marked `live`"
    ]


def test_a_patch_of_an_attribute_that_moved_is_named():
    source = """
        import pytest

        @pytest.mark.gpu
        def test_patches(monkeypatch):
            from gpufeed.pipelines import _clip_loader, _clip_sources

            monkeypatch.setattr(_clip_loader, "log_reader_budget", lambda *a: True)
            monkeypatch.setattr(_clip_sources, "log_reader_budget", lambda *a: True)
            monkeypatch.setattr("gpufeed.pipelines._nvdec_reader.no_such_function", None)
            monkeypatch.setattr("gpufeed.pipelines._nvdec_reader.fused_reader_resize", None)
            monkeypatch.setattr(_clip_loader, "anything", 1, raising=False)
    """
    problems = _problems(source, "test_patches")
    assert len(problems) == 2, problems
    assert problems[0].startswith("test_patches() line 8 patches gpufeed.pipelines._clip_loader.log_reader_budget")
    assert "which does not exist (moved or renamed?)" in problems[0]
    assert "'gpufeed.pipelines._nvdec_reader.no_such_function', which does not exist" in problems[1]


def test_h264_asked_of_dalis_cpu_reader_is_refused_and_the_gpu_one_passes():
    source = """
        import pytest
        from gpufeed.device import DeviceChoice

        CPU = DeviceChoice("cpu", None, "test")
        GPU = DeviceChoice("gpu", 0, "test")

        def _clips(dataset, device, *, decoder="dali"):
            return ClipLoader(dataset, video_cfg=VideoConfig(decoder=decoder), device=device)

        @pytest.fixture
        def vp9_dir(tmp_path):
            return prepare(tmp_path, PrepareOptions(codec="vp9"))

        @pytest.mark.gpu
        def test_reads(synth_dir, vp9_dir):
            dataset = VideoDataset.from_folder(synth_dir / "videos")
            _clips(dataset, GPU)
            _clips(dataset, CPU)
            _clips(VideoDataset.from_folder(vp9_dir), CPU)
    """
    (problem,) = _problems(source, "test_reads")
    assert problem == (
        "line 19: _clips() builds a loader with decoder='dali' on the cpu over h264 videos: DALI's CPU video "
        "reader has no h264 decoder (it decodes mjpeg, vp8, vp9)"
    )
    assert param_problems({"codec": ("h264", "dali", "cpu")}) == [
        "parameter codec=('h264', 'dali', 'cpu') asks for a decoder that does not exist: DALI's CPU video reader "
        "has no h264 decoder (it decodes mjpeg, vp8, vp9)"
    ]
    assert param_problems({"codec": ("h264", "dali", "gpu"), "x": ("vp9", "dali", "cpu")}) == []
    assert param_problems({"codec": ("av1", "pyav", "cpu")}) == [], "PyAV decodes anything FFmpeg does"


def test_an_exact_comparison_of_two_decoders_needs_a_tolerance_or_a_reason():
    source = """
        import numpy as np
        import pytest
        import torch

        @pytest.mark.gpu
        def test_compares(a, b):
            assert torch.equal(a.clips, b.clips)
            assert np.array_equal(a.ids, b.ids)  # exact: sample ids
            # exact: the same decoder on both sides
            assert torch.equal(a.images, b.images)
            assert not torch.equal(a.ids, b.ids), "a difference claims no bit-equality"
            assert (a.clips.int() - b.clips.int()).abs().max() <= 2
    """
    (problem,) = _problems(source, "test_compares")
    assert problem.startswith("test_compares() line 8 compares exactly (torch.equal) with no `# exact: <why>` note")


@pytest.mark.process  # runs pytest in a child process, as CI does
def test_a_broken_gpu_test_fails_on_a_cpu_machine_instead_of_skipping(tmp_path):
    for name in SUPPORT:
        (tmp_path / name).write_text((HERE / name).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu\n    unit\n    process\n    live\n    slow\n")
    (tmp_path / "test_broken.py").write_text(
        textwrap.dedent(
            """
            import pytest
            import torch
            from gpufeed.server import start_server

            @pytest.mark.gpu
            def test_server_without_live():
                start_server(repo="repo", port=0).stop()

            @pytest.mark.gpu
            def test_moved_patch(monkeypatch):
                from gpufeed.pipelines import _clip_loader
                monkeypatch.setattr(_clip_loader, "log_reader_budget", None)

            @pytest.mark.gpu
            def test_fine():
                assert torch.cuda.is_available()
            """
        ),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k != "GPUFEED_REQUIRE_GPU"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=env,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    # test_fine skips here and passes on a GPU: the broken two fail (in their setup) on both.
    assert "1 skipped, 2 errors" in out or "1 passed, 2 errors" in out, out
    assert "test_server_without_live would fail on a GPU: starts a server" in out, out
    assert "test_moved_patch would fail on a GPU: test_moved_patch() line 13 patches" in out, out
