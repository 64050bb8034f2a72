"""``gpufeed doctor``: plain on a CPU machine, every probe real, isolated and bounded on a GPU.

The probes that touch a GPU library take ``device_id=None`` for the same work on the CPU path
(DALI's CPU decoders, onnxruntime's CPU provider), which is how they run here; their GPU twin runs
the CLI on a GPU machine and requires every probe to pass (or to be absent where the hardware
lacks it, as gpufeed's own tables say).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpufeed.doctor import DoctorReport, ProbeResult, run_doctor
from gpufeed.doctor._media import VIDEO_CODECS, psnr_db, source_frame
from gpufeed.doctor._probes import MIN_PSNR_DB, probe_dali_image, probe_nvdec, probe_onnxruntime
from gpufeed.doctor._run import _child, _installed_stack, _packages, run_isolated
from gpufeed.stack import DriverInfo, GpuInfo
from gpufeed.stack._sets import FileSet, InstalledSet

GPU_PROBES = [
    "torch-cuda",
    "dali-gpu",
    "nvjpeg",
    "nvjpeg-hw",
    *(f"nvdec-{c}" for c in VIDEO_CODECS),
    "onnxruntime-cuda",
]


def test_on_a_cpu_machine_the_doctor_says_so_and_exits_0():
    report = run_doctor()
    assert not report.gpu and report.exit_code == 0
    names = [r.name for r in report.results]
    assert names == ["driver", "packages", "libraries", *GPU_PROBES]
    by_name = {r.name: r for r in report.results}
    assert by_name["driver"].status == "skip" and by_name["driver"].summary.startswith("no NVIDIA driver")
    assert by_name["packages"].status == "pass" and by_name["packages"].summary.endswith("stack cpu")
    assert all(by_name[n].status == "skip" and by_name[n].summary == "no NVIDIA GPU" for n in GPU_PROBES)
    text = report.format_text()
    assert text.splitlines()[-1] == "result: " + report.verdict() and "nothing is broken" in text
    assert json.loads(json.dumps(report.to_json()))["exit_code"] == 0


def test_require_gpu_makes_a_missing_gpu_an_error():
    report = run_doctor(require_gpu=True)
    assert report.exit_code == 1 and report.verdict().endswith("a GPU was required (--require-gpu)")


def test_a_failed_probe_makes_the_gpu_path_broken_and_names_it():
    report = DoctorReport(
        gpu=True, results=[ProbeResult("nvjpeg", "pass", "ok"), ProbeResult("nvdec-h264", "fail", "x")]
    )
    report.results.append(ProbeResult("nvdec-av1", "absent", "no AV1 here", fallback="av1 videos decode with PyAV"))
    assert report.exit_code == 1 and report.verdict().startswith("the GPU path is BROKEN: nvdec-h264 failed")
    assert report.fallbacks == ["nvdec-av1: av1 videos decode with PyAV"]
    with pytest.raises(ValueError, match="status 'ok' is not allowed"):
        ProbeResult("x", "ok", "")


def test_a_failure_on_a_cpu_machine_is_not_called_nothing_broken():
    report = DoctorReport(gpu=False, results=[ProbeResult("libraries", "fail", "CUDA majors 12, 13 in one set")])
    assert report.exit_code == 1
    assert report.verdict().endswith("; but libraries failed") and "nothing is broken" not in report.verdict()


# --- the probes, on the CPU path ---------------------------------------------------------------


def test_the_media_tell_a_real_decode_from_a_wrong_one():
    frame = source_frame(0)
    assert psnr_db(frame, frame) == float("inf")
    assert psnr_db(np.zeros_like(frame), frame) < MIN_PSNR_DB
    assert psnr_db(source_frame(1), frame) < MIN_PSNR_DB, "a neighbouring frame must not pass for this one"
    with pytest.raises(ValueError, match="decoded shape"):
        psnr_db(frame[:8], frame)


def test_the_jpeg_probe_decodes_a_real_jpeg():
    (result,) = probe_dali_image(None)
    assert result.name == "jpeg-cpu" and result.status == "pass", result.summary
    assert result.details["psnr_db"] >= MIN_PSNR_DB


def test_the_video_probe_decodes_what_the_reader_can_and_says_what_falls_back():
    (vp9,) = probe_nvdec("vp9", None)
    assert vp9.status == "pass" and vp9.details["psnr_db"] >= MIN_PSNR_DB, vp9.summary
    (h264,) = probe_nvdec("h264", None)  # DALI's CPU reader has no h264: not tried, and said so
    assert h264.status == "absent" and h264.fallback == "h264 videos decode with PyAV on the CPU", h264.summary
    assert h264.summary == "DALI's CPU reader has no h264 decoder: not tried"


def test_the_onnxruntime_probe_runs_a_conv_and_gemm_model():
    (result,) = probe_onnxruntime(None)
    assert result.status == "pass" and result.details["providers"] == ["CPUExecutionProvider"], result.summary


# --- the packages' verdicts --------------------------------------------------------------------


class _Set(FileSet):
    """A set of installed distributions given as data (what the doctor reads from site-packages)."""

    def __init__(self, versions: dict[str, str], texts: dict[str, str]):
        super().__init__()
        self.versions = versions
        self.files = dict.fromkeys(texts, "x")
        self._texts = texts

    def text(self, path: str) -> str:
        return self._texts[path]


_TORCH_13 = {"torch/version.py": "cuda: Optional[str] = '13.0'\n"}
_ORT_12 = {"onnxruntime/capi/build_and_package_info.py": "cuda_version = '12.8'\n"}


def test_two_dali_builds_or_no_dali_is_a_problem():
    both = _Set({"nvidia-dali-cuda120": "2.4.0", "nvidia-dali-cuda130": "2.4.0"}, {})
    assert _installed_stack(both)[0] is None and "overwrite each other's files" in _installed_stack(both)[1][0]
    assert _installed_stack(_Set({}, {}))[1][0].startswith("DALI is not installed")
    gpu = _Set({"nvidia-dali-cuda130": "2.4.0", "nvidia-cudnn-cu13": "9.20", "torch": "2.13.0"}, _TORCH_13)
    assert _installed_stack(gpu) == ("cuda13", [])


def test_mixed_cuda_majors_fail_on_a_gpu_and_a_build_newer_than_the_driver_too():
    mixed = _Set({"nvidia-dali-cuda120": "2.4.0", "onnxruntime-gpu": "1.26.0", "torch": "2.13.0"}, _TORCH_13 | _ORT_12)
    driver = DriverInfo("575.1", (12, 8), (GpuInfo(0, "H100", (9, 0)),))
    result, stack = _packages(mixed, driver, gpu=True)
    assert result.status == "fail" and stack == "cpu"
    assert "CUDA majors 12, 13 are mixed" in result.summary
    assert "torch is built for CUDA 13.0, newer than the driver's CUDA 12.8" in result.summary
    result, _ = _packages(mixed, None, gpu=False)
    assert result.status == "warn", "without a GPU the mix is a warning: nothing loads the CUDA libraries"


def test_a_newer_minor_build_is_a_note_and_a_gpu_without_kernels_in_the_stack_a_fault():
    texts = {"nvidia/dali/__init__.py": "__cuda_version__ = int('13.4.92'.replace('.', ''))\n", **_TORCH_13}
    texts["onnxruntime/capi/build_and_package_info.py"] = "cuda_version = '13.0'\n"
    versions = {
        "nvidia-dali-cuda130": "2.4.0",
        "nvidia-cudnn-cu13": "9.20",
        "torch": "2.13.0",
        "onnxruntime-gpu": "1.31.1",
    }
    b200 = (GpuInfo(0, "B200", (10, 0)),)
    result, stack = _packages(_Set(versions, texts), DriverInfo("580.1", (13, 0), b200), gpu=True)
    assert (result.status, stack) == ("pass", "cuda13"), result.summary
    assert result.details["notes"] == ["DALI 13.4 runs on the driver's CUDA 13.0 by minor-version compatibility"]
    h100 = (GpuInfo(0, "H100", (9, 0)),)  # the cuda13 stack runs on it; make would have picked cuda12: a note
    result, _ = _packages(_Set(versions, texts), DriverInfo("580.1", (13, 0), h100), gpu=True)
    assert result.status == "pass" and result.details["notes"][1].startswith("the driver would pick cuda12")
    v100 = (GpuInfo(0, "V100", (7, 0)),)  # CUDA 13 builds have no Volta kernels: the driver's choice is cuda12
    result, _ = _packages(_Set(versions, texts), DriverInfo("580.1", (13, 0), v100), gpu=True)
    assert result.details["driver_stack"] == "cuda12" and result.status == "fail"
    assert "the cuda13 stack has no kernels for V100 (compute capability 7.0)" in result.summary


# --- the process isolation ---------------------------------------------------------------------


@pytest.mark.process
def test_a_probe_that_crashes_or_hangs_fails_alone():
    crash = run_isolated(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], ["a", "b"], 30
    )
    assert [(r.name, r.status) for r in crash] == [("a", "fail"), ("b", "fail")]
    assert crash[0].summary.startswith("the probe's process crashed (SIGSEGV)")
    started = time.monotonic()
    code = "import sys, time; print('decoding', file=sys.stderr, flush=True); time.sleep(60)"
    (hang,) = run_isolated([sys.executable, "-c", code], ["c"], 1)
    assert hang.summary == "did not finish within 1 s (last words: decoding)" and time.monotonic() - started < 10


@pytest.mark.process
def test_a_probe_child_reports_through_its_marker():
    command = [sys.executable, "-m", "gpufeed.doctor._child", "onnxruntime", json.dumps({"device_id": None})]
    (result,) = run_isolated(command, ["onnxruntime-cpu"], 120)
    assert result.name == "onnxruntime-cpu" and result.status == "pass", result.summary


@pytest.mark.process
def test_a_probe_ignores_a_gpufeed_folder_in_the_working_directory(tmp_path, monkeypatch):
    # A user running `gpufeed doctor` from a checkout: its gpufeed/ folder (the core, without
    # pipelines) came first on the child's import path and failed every probe on an H100.
    shadow = tmp_path / "gpufeed"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('the working directory shadowed the installed gpufeed')\n")
    monkeypatch.chdir(tmp_path)
    (result,) = _child("onnxruntime", {"device_id": None}, ["onnxruntime-cpu"], 120)
    assert result.name == "onnxruntime-cpu" and result.status == "pass", result.summary


@pytest.mark.process
def test_the_cli_on_a_cpu_machine(tmp_path):
    # From a folder of its own, as a user runs it: in the checkout, `-m` would import its gpufeed/ folder.
    proc = subprocess.run([sys.executable, "-m", "gpufeed", "doctor"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("gpufeed doctor\n") and "result: no NVIDIA GPU on this machine" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "gpufeed", "doctor", "--json", "--require-gpu"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["exit_code"] == 1 and report["gpu"] is False


# --- the GPU twin ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.process
def test_every_probe_passes_on_a_gpu_machine(tmp_path):
    """On a GPU: exit 0 well within the GPU host procedure's 120 s, and every probe passes, or is absent where the
    hardware lacks it (AV1 on an A100/H100, the hardware JPEG decoder off the data-centre parts)."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpufeed", "doctor", "--json", "--require-gpu"], capture_output=True,
                          text=True, timeout=150, cwd=tmp_path)  # fmt: skip
    elapsed_s = time.monotonic() - started
    report = json.loads(proc.stdout)
    results = {r["name"]: r for r in report["results"]}
    lines = "\n".join(f"{n}: {r['status']}: {r['summary']}" for n, r in results.items())
    assert proc.returncode == 0 and report["gpu"], lines + proc.stderr[-2000:]
    assert elapsed_s < 100, f"the doctor took {elapsed_s:.0f} s; the GPU host procedure gives it 120"
    for name in ["driver", "packages", "libraries", "torch-cuda", "dali-gpu", "nvjpeg", "onnxruntime-cuda"]:
        assert results[name]["status"] == "pass", lines
    absent_ok = {"nvjpeg-hw", "nvdec-av1"}
    for name in ["nvjpeg-hw", *(f"nvdec-{c}" for c in VIDEO_CODECS)]:
        status = results[name]["status"]
        assert status == "pass" or (status == "absent" and name in absent_ok and results[name]["fallback"]), lines


def _site(root: Path, name: str, version: str, files: list[str]) -> Path:
    dist = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for path in files:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")
    record = [*files, f"{dist.name}/METADATA", f"{dist.name}/RECORD"]
    (dist / "RECORD").write_text("".join(f"{p},,\n" for p in record))
    return root


def test_the_doctor_reads_the_packages_python_imports_from_every_folder_on_its_path(tmp_path):
    """A --target folder on PYTHONPATH before the venv: its onnxruntime-gpu is the one imported, the venv's
    onnxruntime is passed over (not a clash), and DALI installed only there is found."""
    target = _site(tmp_path / "target", "onnxruntime-gpu", "1.31.1", ["onnxruntime/__init__.py"])
    _site(target, "nvidia-dali-cuda120", "2.4.0", ["nvidia/dali/__init__.py"])
    venv = _site(tmp_path / "venv", "onnxruntime", "1.30.0", ["onnxruntime/__init__.py", "onnxruntime/capi/x.py"])
    files = InstalledSet([target, venv])
    assert files.versions == {"onnxruntime-gpu": "1.31.1", "nvidia-dali-cuda120": "2.4.0"}
    assert files.shadowed == [f"onnxruntime 1.30.0 ({venv})"] and not files.collisions
    stack, problems = _installed_stack(files)
    assert stack == "cpu" and problems == []  # no CUDA libraries in either folder
    result, _ = _packages(files, None, gpu=False)
    assert "not imported (an earlier folder on the import path holds the package): onnxruntime 1.30.0" in result.summary
    alone = InstalledSet(venv)  # the venv alone: its onnxruntime, no DALI
    assert alone.versions == {"onnxruntime": "1.30.0"} and "DALI is not installed" in _installed_stack(alone)[1][0]
