"""The CUDA stack: the ELF reader, the load replay, the stack choice and its requirement sets.

The ELF files are the shared libraries DALI, nvImageCodec and onnxruntime-gpu installed here (the
cpu stack: their CUDA 12 builds without the CUDA library wheels), so nothing is downloaded. The
remote wheel reader is tested against a local HTTP server that honours byte ranges (``live``), and
the full check of both GPU stacks, which reads about 4 GB from PyPI, is ``slow``.
"""

from __future__ import annotations

import dataclasses
import http.server
import importlib.metadata
import importlib.util
import os
import posixpath
import re
import struct
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import ClassVar

import pytest

from gpufeed.stack import (
    CUDA13_REPLACEMENTS,
    STACKS,
    DriverInfo,
    ElfError,
    GpuInfo,
    LoadReplay,
    StackChoiceError,
    check_installed,
    choose_stack,
    cuda_builds_of,
    read_driver,
    read_elf,
    read_pyproject_requirements,
    stack_requirements,
)
from gpufeed.stack._loader import onnxruntime_preload_paths
from gpufeed.stack._sets import InstalledSet, elf_from_json, elf_to_json
from gpufeed.stack._wheels import RemoteWheel, wheel_path

ROOT = Path(__file__).resolve().parents[1]
# The folder the installed DALI is imported from: the venv's site-packages, or a --target folder on
# PYTHONPATH (as on the GPU host), not necessarily this interpreter's own.
SITE = Path(importlib.util.find_spec("nvidia.dali").origin).parents[2]
PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
OPERATORS = "nvidia/dali/libdali_operators.so"
NVJPEG_EXT = next(
    p.relative_to(SITE).as_posix() for p in (SITE / "nvidia/nvimgcodec/extensions").glob("libnvjpeg_ext.so*")
)


def _elf(path: str):
    with open(SITE / path, "rb") as f:
        return read_elf(f)


def _ort_cuda_major() -> int:
    from onnxruntime.capi import build_and_package_info

    return int(build_and_package_info.cuda_version.split(".")[0])


# --- the ELF reader ----------------------------------------------------------------------------


def test_the_reader_sees_what_the_dynamic_linker_sees_in_onnxruntimes_cuda_provider():
    info = _elf(PROVIDER)
    major = _ort_cuda_major()
    assert info.machine == "x86-64" and info.bits == 64
    assert {f"libcublasLt.so.{major}", f"libcublas.so.{major}", f"libcudart.so.{major}", "libc.so.6"} <= set(
        info.needed
    )
    assert info.runpath == () and info.rpath == () and info.soname == ""  # found only through what is loaded first
    bound = {(s.name, s.library) for s in info.undefined}
    assert ("cudaFreeHost", f"libcudart.so.{major}") in bound
    assert all(s.version == s.library for s in info.undefined if s.library.startswith("libcu"))


def test_the_reader_sees_dalis_runpath_soname_and_versioned_symbols():
    info = _elf(OPERATORS)
    assert info.soname == "libdali_operators.so"
    assert "$ORIGIN/../nvimgcodec" in info.runpath and "$ORIGIN/../nvjpeg/lib" in info.runpath
    assert info.needed[:3] == ("libdali.so", "libdali_kernels.so", "libdali_core.so")
    assert any(s.library == "libdali.so" and s.version.startswith("DALI_") for s in info.undefined)
    nvjpeg = _elf("nvidia/nvjpeg/lib/libnvjpeg.so.12")
    assert nvjpeg.soname == "libnvjpeg.so.12" and ("nvjpegCreateSimple", "libnvjpeg.so.12") in nvjpeg.defined_versions


def test_without_section_headers_the_symbol_count_comes_from_the_gnu_hash_table(tmp_path):
    """A copy with its section headers cut off (as some strippers leave files) reads the same."""
    original = SITE / "nvidia/nvimgcodec/libnvimgcodec.so.0"
    data = bytearray(original.read_bytes())
    struct.pack_into("<Q", data, 0x28, 0)  # e_shoff
    struct.pack_into("<H", data, 0x3C, 0)  # e_shnum
    copy = tmp_path / "no-sections.so"
    copy.write_bytes(bytes(data))
    with open(original, "rb") as f, open(copy, "rb") as g:
        want, got = read_elf(f), read_elf(g)
    assert got.defined == want.defined and got.undefined == want.undefined and len(want.defined) > 20


def test_a_file_that_is_not_elf_or_is_cut_short_is_a_one_line_error(tmp_path):
    text = tmp_path / "notes.so"
    text.write_bytes(b"not a library at all, just words" * 4)
    with open(text, "rb") as f, pytest.raises(ElfError, match="not an ELF file"):
        read_elf(f)
    cut = tmp_path / "cut.so"
    cut.write_bytes((SITE / "nvidia/nvjpeg/lib/libnvjpeg.so.12").read_bytes()[:4096])
    with open(cut, "rb") as f, pytest.raises(ElfError, match="outside the 4096-byte file"):
        read_elf(f)


def test_elf_facts_survive_the_cache_format():
    info = _elf(NVJPEG_EXT)
    assert elf_from_json(elf_to_json(info)) == info


# --- the load replay ---------------------------------------------------------------------------


def test_the_installed_cpu_stack_loads_dali_and_nvjpeg_but_not_the_cuda_provider():
    """This venv holds the cpu stack: DALI and nvImageCodec resolve; onnxruntime's CUDA libraries do not."""
    report = check_installed(SITE, cuda_major=12)
    found = {(f.component, f.name): f for f in report.found}
    nvjpeg = found[("nvImageCodec", "libnvjpeg.so.12")]
    assert (nvjpeg.how, nvjpeg.where, nvjpeg.package) == (
        "package",
        "nvidia/nvjpeg/lib/libnvjpeg.so.12",
        "nvidia-nvjpeg-cu12",
    )
    assert found[("DALI", "libnvimgcodec.so.0")].where == "nvidia/nvimgcodec/libnvimgcodec.so.0"
    assert found[("DALI", "libnvcuvid.so.1")].how == "driver" and found[("DALI", "libcuda.so.1")].how == "driver"
    assert not [p for p in report.problems if not p.startswith("onnxruntime:")], report.problems
    major = _ort_cuda_major()
    assert f"onnxruntime: libcublasLt.so.{major} (DT_NEEDED of {PROVIDER}) is in no package" in report.problems
    assert found[("onnxruntime", f"libcudart.so.{major}")].how == "missing"


def _replay(files: dict[str, str], real: dict[str, str]) -> LoadReplay:
    """A replay over ``files`` whose ELF facts are those of real files of this venv, under other names."""

    def elf(path: str):
        info = _elf(real.get(path, path))
        return dataclasses.replace(info, soname=posixpath.basename(path)) if path in real else info

    return LoadReplay(files, elf, cuda_major=12)


def test_a_library_lacking_the_symbols_a_caller_was_built_against_is_reported():
    """libdali_operators.so needs DALI_2.4.0 symbols of libdali.so; libdali_core.so posing as it has none."""
    dali = "nvidia/dali/"
    files = {p.relative_to(SITE).as_posix(): "nvidia-dali-cuda120" for p in (SITE / dali).glob("lib*.so")}
    files |= {p.relative_to(SITE).as_posix(): "nvidia-dali-cuda120" for p in (SITE / dali / ".libs").iterdir()}
    honest = _replay(files, {})
    honest.load_path("DALI", OPERATORS, "test")
    assert not [p for p in honest.problems if "symbol" in p], honest.problems
    impostor = _replay(files, {dali + "libdali.so": dali + "libdali_core.so"})
    impostor.load_path("DALI", OPERATORS, "test")
    (problem,) = [p for p in impostor.problems if "symbol" in p and p.startswith(f"DALI: {OPERATORS} needs")]
    assert f"that {dali}libdali.so (nvidia-dali-cuda120) does not define" in problem and "@DALI_" in problem


def test_a_library_present_but_off_the_search_path_is_named_with_where_it_lies():
    ext = NVJPEG_EXT
    files = {ext: "nvidia-nvimgcodec-cu12", "nvidia/elsewhere/libnvjpeg.so.12": "nvidia-nvjpeg-cu12"}
    replay = _replay(files, {"nvidia/elsewhere/libnvjpeg.so.12": "nvidia/nvjpeg/lib/libnvjpeg.so.12"})
    replay.load_path("nvImageCodec", ext, "test")
    replay.run_dlopens()
    assert replay.problems == [
        f"nvImageCodec: libnvjpeg.so.12 (dlopen of {ext}) is present at nvidia/elsewhere/libnvjpeg.so.12 but not "
        f"on {ext}'s search path"
    ]


def test_opened_by_name_after_a_preload_matches_the_loaded_library_by_soname():
    """cuBLASLt opens NVRTC by name at first use: onnxruntime preloads NVRTC before that, so it is found."""
    nvjpeg = "nvidia/nvjpeg/lib/libnvjpeg.so.12"
    files = {"nvidia/cublas/lib/libcublasLt.so.12": "cublas", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12": "nvrtc"}
    replay = _replay(files, dict.fromkeys(files, nvjpeg))
    replay.load_path("onnxruntime", "nvidia/cublas/lib/libcublasLt.so.12", "onnxruntime.preload_dlls()")
    replay.load_path("onnxruntime", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "onnxruntime.preload_dlls()")
    replay.run_dlopens()
    (nvrtc,) = [f for f in replay.found if f.name == "libnvrtc.so.12"]
    assert (nvrtc.how, nvrtc.where) == ("loaded", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12")


def test_onnxruntimes_own_preload_list_is_read_from_its_source():
    source = (SITE / "onnxruntime/__init__.py").read_text()
    paths = onnxruntime_preload_paths(source, "12.8")
    assert paths[:2] == ["nvidia/cublas/lib/libcublasLt.so.12", "nvidia/cublas/lib/libcublas.so.12"]
    assert "nvidia/cudnn/lib/libcudnn.so.9" in paths and "nvidia/cuda_runtime/lib/libcudart.so.12" in paths
    with pytest.raises(ValueError, match="lacks"):
        onnxruntime_preload_paths("def preload_dlls(): pass\n", "12.8")


def test_the_cuda_builds_of_the_installed_packages():
    builds = cuda_builds_of(InstalledSet(SITE))
    from onnxruntime.capi import build_and_package_info

    assert builds["onnxruntime"] == build_and_package_info.cuda_version
    assert builds["nvidia-dali-cuda120"] == "12" and builds["DALI"].startswith("12.")
    assert builds["nvidia-nvjpeg-cu12"] == "12" and "torch" not in builds  # the CPU wheel of torch


def test_the_installed_set_lists_the_files_importlib_metadata_lists(tmp_path):
    """The set reads RECORD as text: the same paths as ``dist.files``, odd names included (a quoted
    comma, ``./``, ``//`` and ``/./`` parts, a folder's slash, a backslash; files outside the folder left out)."""
    dist = tmp_path / "odd-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: odd\nVersion: 1.0\n")
    names = ["odd/__init__.py", '"odd/a,b.py"', "./odd/dot.py", "odd//double.py", "odd/./here.py", "odd/dir/",
             "odd\\win.py", "../../bin/odd", "odd/lib.so.1", "odd-1.0.dist-info/RECORD"]  # fmt: skip
    (dist / "RECORD").write_text("".join(f"{name},sha256=AAAA,12\n" for name in names))
    (listed,) = importlib.metadata.distributions(path=[str(tmp_path)])
    expected = [str(f).replace("\\", "/") for f in listed.files or () if not str(f).startswith("..")]
    files = InstalledSet(tmp_path)
    assert list(files.files) == expected and set(files.files.values()) == {"odd"}
    assert {"odd/a,b.py", "odd/dot.py", "odd/double.py", "odd/here.py", "odd/dir", "odd/win.py"} <= set(files.files)
    assert files.versions == {"odd": "1.0"}


def test_a_wheel_member_lands_where_pip_puts_it():
    assert wheel_path("nvidia/cu13/lib/libcudart.so.13") == "nvidia/cu13/lib/libcudart.so.13"
    assert wheel_path("pkg-1.0.data/platlib/x/y.so") == "x/y.so" and wheel_path("pkg-1.0.data/scripts/run") is None


# --- the stack choice --------------------------------------------------------------------------


def _driver(cuda: tuple[int, int], *capabilities: tuple[int, int]) -> DriverInfo:
    gpus = tuple(GpuInfo(i, f"GPU{i}", c) for i, c in enumerate(capabilities))
    return DriverInfo("999.1", cuda, gpus)


@pytest.mark.parametrize(
    ("driver", "stack"),
    [
        (None, "cpu"),
        (_driver((13, 0), (9, 0)), "cuda12"),  # H100 on driver 580: torch's cu126 build has Hopper kernels
        (_driver((12, 8), (9, 0)), "cuda12"),  # H100 on driver 570
        (_driver((12, 0), (8, 0)), "cuda12"),
        (_driver((13, 0), (7, 0)), "cuda12"),  # V100
        (_driver((13, 0), (10, 0)), "cuda13"),  # B200: no kernels in cu126
        (_driver((13, 1), (12, 0), (8, 6)), "cuda13"),  # RTX 5090 beside an A6000
    ],
)
def test_the_stack_is_cuda12_unless_a_gpu_needs_cuda13(driver, stack):
    assert choose_stack(driver)[0].name == stack


def test_no_stack_fits_an_old_driver_a_blackwell_on_a_cuda_12_driver_or_a_blackwell_beside_a_volta():
    with pytest.raises(StackChoiceError, match=r"supports CUDA 11\.8; DALI and onnxruntime need CUDA 12\.0"):
        choose_stack(_driver((11, 8), (8, 0)))
    with pytest.raises(StackChoiceError, match=r"GPU0 \(compute capability 10\.0\) needs the CUDA 13 builds .* update"):
        choose_stack(_driver((12, 8), (10, 0)))
    with pytest.raises(
        StackChoiceError, match=r"no kernels for GPU1 \(compute capability 7\.0\): no one stack runs both"
    ):
        choose_stack(_driver((13, 0), (10, 0), (7, 0)))
    with pytest.raises(StackChoiceError, match=r"GPU0 \(compute capability 3\.7\) is older than every stack's kernels"):
        choose_stack(_driver((12, 4), (3, 7)))
    # Maxwell: torch's cu126 build has sm_50 code, onnxruntime-gpu 1.26's CUDA provider none below sm_60.
    with pytest.raises(
        StackChoiceError, match=r"GPU0 \(compute capability 5\.2\) is older than every stack's kernels \(6\.0"
    ):
        choose_stack(_driver((12, 4), (5, 2)))


# --- the requirement sets ----------------------------------------------------------------------

DECLARED = read_pyproject_requirements(str(ROOT / "pyproject.toml"))
_CUDA12_NAMES = re.compile(r"^(nvidia-dali-cuda120|nvidia-[a-z-]+-cu12|onnxruntime-gpu\S*<1\.27)")


def _names(lines: list[str]) -> list[str]:
    return [re.match(r"[A-Za-z0-9._-]+", line).group(0).lower() for line in lines]


def test_the_cuda_12_builds_are_the_runtime_dependencies_and_cuda12_the_only_stack_extra():
    runtime, extras = DECLARED
    assert "nvidia-dali-cuda120>=2.4" in runtime and "onnxruntime-gpu>=1.20,<1.27" in runtime
    assert extras["cuda12"] == ["onnxruntime-gpu[cuda,cudnn]>=1.21,<1.27"]
    assert not {"cpu", "cuda13"} & set(extras), "an extra can only add: a cuda13 extra would install both DALIs"
    # The CPU build by its local version (PyPI's 2.13.0 is the CUDA 13 build), from PyTorch's CPU index
    # where no local wheel has it; cuda13 takes PyPI's.
    assert STACKS["cpu"].torch_args == (
        "torch==2.13.0+cpu",
        "--extra-index-url",
        "https://download.pytorch.org/whl/cpu",
        "--retries",
        "1",
    )
    assert STACKS["cuda13"].torch_args == ("torch==2.13.0",)
    assert STACKS["cuda12"].torch_args[-1] == "https://download.pytorch.org/whl/cu126"


def test_the_cpu_set_is_the_runtime_dependencies_and_cuda12_adds_its_extra():
    runtime, extras = DECLARED
    assert stack_requirements("cpu", declared=DECLARED) == runtime
    assert stack_requirements("cuda12", declared=DECLARED) == runtime + extras["cuda12"]


@pytest.mark.parametrize("extras", [(), ("test",)])
def test_the_cuda13_set_replaces_the_cuda_12_builds_and_repeats_nothing(extras):
    runtime, _ = DECLARED
    lines = stack_requirements("cuda13", extras, declared=DECLARED)
    assert not [line for line in lines if _CUDA12_NAMES.match(line)], lines
    names = _names(lines)
    assert names.count("nvidia-dali-cuda130") == 1 and names.count("onnxruntime-gpu") == 1, lines
    assert "onnxruntime-gpu[cuda,cudnn]>=1.27,<1.29" in lines and "gpufeed" not in names
    assert len(lines) == len(set(lines)), "a line repeated"
    assert lines[: len(runtime)] == [CUDA13_REPLACEMENTS.get(_names([r])[0], r) for r in runtime]
    if extras:  # gpufeed[bench,demo,grpc,docs] inside test: their packages, once each
        assert {"pytest", "httpx", "litserve", "grpcio", "mkdocs"} <= set(names) and names.count("httpx") == 1


def test_the_cuda13_dali_keeps_the_runtime_dependencys_floor():
    (dali,) = [line for line in DECLARED[0] if line.startswith("nvidia-dali-cuda120")]
    assert CUDA13_REPLACEMENTS["nvidia-dali-cuda120"] == dali.replace("cuda120", "cuda130")


def test_an_unknown_stack_or_extra_or_cuda12_with_another_stack_is_refused():
    with pytest.raises(ValueError, match="unknown CUDA stack 'cuda11'; allowed: cpu, cuda12, cuda13"):
        stack_requirements("cuda11", declared=DECLARED)
    with pytest.raises(
        ValueError, match="gpufeed has no extra 'gpu'; it has: bench, demo, grpc, docs, s3, test, cuda12"
    ):
        stack_requirements("cpu", ["gpu"], declared=DECLARED)
    for stack in ("cpu", "cuda13"):
        with pytest.raises(ValueError, match=f"the cuda12 extra .* does not go with {stack}"):
            stack_requirements(stack, ["test", "cuda12"], declared=DECLARED)


def test_without_a_driver_nvml_is_not_found_and_says_so():
    driver, why = read_driver("libnvidia-ml-that-does-not-exist.so.1")
    assert driver is None and why.startswith("no NVIDIA driver: libnvidia-ml-that-does-not-exist.so.1 cannot be loaded")


# A stand-in for NVML with a node's answers: GPU 0 refused (another job's, under cgroups), GPU 1 an
# H100; FAKE_NVML=broken makes the name query fail, as a driver/library mismatch can.
_FAKE_NVML = r"""
#include <stdlib.h>
#include <string.h>
static int broken(void) { const char *m = getenv("FAKE_NVML"); return m && !strcmp(m, "broken"); }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int code) { return code == 999 ? "Unknown Error" : "error"; }
int nvmlSystemGetDriverVersion(char *v, unsigned n) { strncpy(v, "580.82.07", n); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { if (i == 0) return 4; *h = (void *)1; return 0; }
int nvmlDeviceGetName(void *h, char *v, unsigned n) { if (broken()) return 999; strncpy(v, "H100", n); return 0; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *a, int *b) { *a = 9; *b = 0; return 0; }
"""


@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory):
    from _fake_nvml import compile_nvml

    return compile_nvml(tmp_path_factory.mktemp("nvml"), _FAKE_NVML)


@pytest.mark.process  # the compiler
def test_gpus_another_job_holds_are_left_out_and_a_failing_nvml_is_no_cpu_machine(fake_nvml, monkeypatch):
    driver, why = read_driver(fake_nvml, strict=True)
    assert driver is not None and [g.name for g in driver.gpus] == ["H100"], why
    assert why.endswith("1 GPU(s): H100 (9.0); 1 more this process may not use")
    assert choose_stack(driver)[0].name == "cuda12"
    monkeypatch.setenv("FAKE_NVML", "broken")
    assert read_driver(fake_nvml)[0] is None  # the doctor reads on, and says why
    with pytest.raises(StackChoiceError, match=r"NVML answered but a query failed .*Unknown Error.*: set CUDA_STACK"):
        read_driver(fake_nvml, strict=True)  # make stops there rather than install the cpu stack


@pytest.mark.process
def test_the_makefile_runs_the_choice_with_the_systems_python_before_any_venv():
    """gpufeed/stack/_choice.py imports only the standard library: run as a file, outside the venv's site."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    script = ROOT / "gpufeed/stack/_choice.py"
    run = [sys.executable, "-I", "-S", str(script)]  # -S: not even site-packages
    found = read_driver()[0]
    want = choose_stack(found)[0].name
    assert subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout == f"{want}\n"
    args = subprocess.run([*run, "torch-args", "cuda12"], capture_output=True, text=True, env=env, check=True).stdout
    assert args == "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126\n"
    bad = subprocess.run([*run, "torch-args", "cuda11"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "usage:" in bad.stderr
    pyproject = ["--pyproject", str(ROOT / "pyproject.toml")]
    printed = subprocess.run([*run, "requirements", "cuda13", "test", *pyproject], capture_output=True, text=True,
                             env=env, check=True).stdout  # fmt: skip
    assert printed.splitlines() == stack_requirements("cuda13", ["test"], declared=DECLARED)
    bad = subprocess.run([*run, "requirements", "cpu", "cuda12", *pyproject], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.strip().endswith("it does not go with cpu"), bad.stderr


# --- the remote wheel reader -------------------------------------------------------------------


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with byte ranges (``bytes=a-b`` and ``bytes=-n``), counting requests."""

    requests: ClassVar[list[str]] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        data = path.read_bytes()
        spec = self.headers["Range"].removeprefix("bytes=")
        start_s, _, end_s = spec.partition("-")
        start = len(data) - int(end_s) if not start_s else int(start_s)
        end = len(data) - 1 if not start_s or not end_s else int(end_s)
        self.requests.append(spec)
        body = data[start : end + 1]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.live
def test_a_remote_wheel_is_read_by_ranges_and_cached(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    wheel = served / "demo-1.0-py3-none-manylinux_2_28_x86_64.whl"
    so = SITE / "nvidia/nvjpeg/lib/libnvjpeg.so.12"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.write(so, "demo/lib/libnvjpeg.so.12")
        z.writestr("demo/__init__.py", "VERSION = '1.0'\n")
        z.writestr("demo-1.0.data/scripts/tool", "#!/bin/sh\n")
    handler = type("Handler", (_RangeHandler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{wheel.name}"
        remote = RemoteWheel(url, tmp_path / "cache")
        assert set(remote.members()) == {"demo/lib/libnvjpeg.so.12", "demo/__init__.py", "demo-1.0.data/scripts/tool"}
        assert len(handler.requests) == 2 and handler.requests[0] == "-65536"  # the tail, then the directory
        assert remote.read("demo/__init__.py") == b"VERSION = '1.0'\n"
        with remote.open_member("demo/lib/libnvjpeg.so.12", tmp_path / "tmp") as f:
            assert f.read() == so.read_bytes()
        before = len(handler.requests)
        assert set(RemoteWheel(url, tmp_path / "cache").members()) == set(remote.members())
        assert len(handler.requests) == before, "the second file list came from the network, not the cache"
    finally:
        server.shutdown()
    assert not any((tmp_path / "tmp").iterdir()), "a temporary member was left behind"


# --- the full check, against PyPI --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("stack", ["cuda12", "cuda13"])
def test_each_gpu_stacks_install_set_loads(stack):
    """``make check-cuda-stack`` for one stack: resolves from PyPI and reads about 2 GB of wheels (cached)."""
    from gpufeed.stack import check_stack

    report = check_stack(stack, root=ROOT, cache=ROOT / ".cache" / "cuda-stack")
    assert report.ok, "\n".join(report.problems)
    builds = {v.split(".")[0] for v in report.cuda_builds.values()}
    assert builds == {stack[4:]}, report.cuda_builds
