"""``gpufeed doctor``: probe every part of the GPU path, each bounded in time and isolated.

Three probes read files only and run in this process: the driver (NVML), the installed packages
and their CUDA builds (read from their build-info files, nothing imported), and the libraries the
GPU code would load (:func:`gpufeed.stack.check_installed`, an ELF replay). The probes that touch
the GPU (torch, DALI's image decoders, NVDEC per codec, onnxruntime's CUDA provider) each run in a
child process with a time limit, all at once: a crash or hang in a native library is that probe's
failure, and the others still report.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpufeed.core import module_argv
from gpufeed.doctor._child import MARKER
from gpufeed.doctor._media import VIDEO_CODECS
from gpufeed.doctor._report import DoctorReport, ProbeResult
from gpufeed.stack import (
    STACKS,
    DriverInfo,
    InstalledSet,
    StackChoiceError,
    check_installed,
    choose_stack,
    cuda_builds_of,
    import_path_folders,
    read_driver,
)

__all__ = ["DEFAULT_TIMEOUT_S", "run_doctor", "run_isolated"]

# Each child imports torch or DALI (a few seconds) and decodes a few kB: 60 s is slack, and the
# children run at once, so the whole doctor stays well inside the 120 s the GPU host procedure gives it.
DEFAULT_TIMEOUT_S = 60.0
"""Each child probe's time limit, in seconds (``gpufeed doctor --timeout-s``)."""
_DALI = ("nvidia-dali-cuda120", "nvidia-dali-cuda130")
_STACK_HINT = "make clean && make in a checkout, or the pip lines of docs/gpu.md 'CUDA stacks'"


def _driver() -> tuple[ProbeResult, DriverInfo | None, bool]:
    started = time.monotonic()
    driver, why = read_driver()
    seconds = round(time.monotonic() - started, 3)
    if driver is not None:
        details = {"driver": driver.driver_version, "cuda": list(driver.cuda_version),
                   "gpus": [[g.name, list(g.compute_capability)] for g in driver.gpus]}  # fmt: skip
        return ProbeResult("driver", "pass", why, details=details, seconds=seconds), driver, True
    if Path("/dev/nvidia0").exists():  # a GPU device without NVML: a container without 'utility'
        summary = f"{why}, yet /dev/nvidia0 exists: is NVIDIA_DRIVER_CAPABILITIES missing 'utility'?"
        return ProbeResult("driver", "warn", summary, seconds=seconds), None, True
    return ProbeResult("driver", "skip", why, seconds=seconds), None, False


def _installed_stack(files: InstalledSet) -> tuple[str | None, list[str]]:
    """The stack the environment holds (``None``: none or a mix), and what is wrong with it."""
    dali = [name for name in _DALI if name in files.versions]
    problems = []
    if not dali:
        problems.append(f"DALI is not installed (gpufeed was installed with --no-deps?): {_STACK_HINT}")
    if len(dali) > 1:
        problems.append(
            f"{' and '.join(dali)} are both installed and overwrite each other's files: uninstall both, then {_STACK_HINT}"
        )
    runtimes = [name for name in ("onnxruntime", "onnxruntime-gpu") if name in files.versions]
    if len(runtimes) > 1:
        problems.append("onnxruntime and onnxruntime-gpu are both installed (one overwrites the other): uninstall both, "
                        "then install onnxruntime-gpu")  # fmt: skip
    if problems or not dali:
        return None, problems
    major = dali[0][-3:-1]  # nvidia-dali-cuda120 -> "12"
    has_cuda_libraries = any(name.startswith(("nvidia-cudnn", "nvidia-cublas")) for name in files.versions)
    return (f"cuda{major}" if has_cuda_libraries else "cpu"), []


def _packages(files: InstalledSet, driver: DriverInfo | None, gpu: bool) -> tuple[ProbeResult, str | None]:
    started = time.monotonic()
    builds = cuda_builds_of(files)
    stack, problems = _installed_stack(files)
    shown = {
        name: files.versions[name]
        for name in ("torch", *_DALI, "onnxruntime-gpu", "onnxruntime")
        if name in files.versions
    }
    main = {k: builds.get(k) for k in ("torch", "DALI", "onnxruntime")}
    builds_line = ", ".join(f"{k} {v or 'CPU build'}" for k, v in main.items())
    summary = f"{', '.join(f'{k} {v}' for k, v in shown.items())}; CUDA builds: {builds_line}; stack {stack or '?'}"
    details: dict = {"versions": shown, "cuda_builds": builds, "stack": stack}
    majors = {v.split(".")[0] for v in builds.values() if v}
    if len(majors) > 1:
        problems.append(
            f"CUDA majors {', '.join(sorted(majors))} are mixed (two CUDA runtimes in one process): {_STACK_HINT}"
        )
    notes: list[str] = []
    key = ("torch", *_DALI, "onnxruntime", "onnxruntime-gpu")
    passed_over = [d for d in getattr(files, "shadowed", []) if d.split(" ", 1)[0] in key]
    if passed_over:
        notes.append(f"not imported (an earlier folder on the import path holds the package): {', '.join(passed_over)}")
    if driver is not None:
        for name, version in main.items():
            if not version:
                continue
            built = tuple(int(p) for p in version.split(".")[:2])
            driver_cuda = f"{driver.cuda_version[0]}.{driver.cuda_version[1]}"
            if built[0] > driver.cuda_version[0]:
                problems.append(f"{name} is built for CUDA {version}, newer than the driver's CUDA {driver_cuda}: update the "
                                f"driver, or install the cuda{driver.cuda_version[0]} stack")  # fmt: skip
            elif built > driver.cuda_version:  # CUDA's minor-version compatibility runs it (PTX JIT aside)
                notes.append(
                    f"{name} {built[0]}.{built[1]} runs on the driver's CUDA {driver_cuda} by minor-version compatibility"
                )
        if stack is not None:
            low, high = STACKS[stack].compute_capabilities
            for gpu_info in driver.gpus:
                if not low <= gpu_info.compute_capability <= high:
                    cc = ".".join(map(str, gpu_info.compute_capability))
                    problems.append(f"the {stack} stack has no kernels for {gpu_info.name} (compute capability {cc})")
        try:
            wanted, why = choose_stack(driver)
            details["driver_stack"] = wanted.name
            if stack is None:
                problems.append(f"the driver takes the {wanted.name} stack: {wanted.install}")
            elif wanted.name != stack:  # an older major still runs (cuda12 on a CUDA 13 driver): a note, not a fault
                notes.append(f"the driver would pick {wanted.name} ({why})")
        except StackChoiceError as err:
            problems.append(str(err))
    details["notes"] = notes
    status = "fail" if problems and (gpu or stack is None) else "warn" if problems else "pass"
    if problems or notes:
        summary += "; " + "; ".join(problems + notes)
    return ProbeResult(
        "packages", status, summary, details=details, seconds=round(time.monotonic() - started, 3)
    ), stack


def _libraries(files: InstalledSet, stack: str | None, gpu: bool) -> ProbeResult:
    started = time.monotonic()
    if stack is None:
        return ProbeResult("libraries", "skip", "no single stack installed (see packages)")
    if stack == "cpu":
        status = "fail" if gpu else "skip"
        summary = "the cpu stack installs no CUDA libraries, so onnxruntime's CUDA provider cannot load"
        hint = f": install the cuda12 stack ({STACKS['cuda12'].install}) or {_STACK_HINT}"
        return ProbeResult("libraries", status, summary + (hint if gpu else " (none needed without a GPU)"))
    report = check_installed(files, int(stack[4:]))
    packages = {f.package for f in report.found if f.package}
    absent = sorted({f.name for f in report.found if f.how == "missing" and not f.required})
    summary = (f"{len({f.where for f in report.found if f.how == 'package'})} libraries from {len(packages)} packages, "
               "plus the driver's and the system's, hold everything onnxruntime's CUDA provider, DALI and nvImageCodec load")  # fmt: skip
    if report.problems:
        summary = "; ".join(report.problems[:3]) + (
            f" and {len(report.problems) - 3} more" if len(report.problems) > 3 else ""
        )
    details = {"problems": report.problems, "optional_absent": absent, "packages": sorted(packages)}
    return ProbeResult("libraries", "fail" if report.problems else "pass", summary, details=details,
                       seconds=round(time.monotonic() - started, 3))  # fmt: skip


def _child(probe: str, kwargs: dict, names: list[str], timeout_s: float) -> list[ProbeResult]:
    """Run one probe in a child process; its results, or one failed result per expected name.

    From a gpufeed checkout, the working directory's ``gpufeed/`` folder (the core alone, without
    ``pipelines``) would shadow the installed package and fail every probe (seen on an H100): the
    child runs without the working directory on its import path (:func:`~gpufeed.core.module_argv`)
    and, for Python 3.10, which cannot leave it off, in an empty folder of its own.
    """
    command = module_argv("gpufeed.doctor._child", probe, json.dumps(kwargs))
    with tempfile.TemporaryDirectory(prefix="gpufeed-doctor-") as folder:
        return run_isolated(command, names, timeout_s, cwd=folder)


def run_isolated(command: list[str], names: list[str], timeout_s: float, cwd: str | None = None) -> list[ProbeResult]:
    """Run ``command`` (a probe's child process) and read its results after :data:`MARKER`.

    A child that crashes (a signal), exits with an error, prints no results or outlives
    ``timeout_s`` gives one ``fail`` result per name in ``names``, saying which, with the last
    lines it wrote to stderr. ``cwd`` is the child's working directory (default: this one's).
    """
    started = time.monotonic()
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, start_new_session=True, cwd=cwd
        )
    except subprocess.TimeoutExpired as err:
        last = (err.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] if err.stderr else []
        why = f"did not finish within {timeout_s:g} s" + (f" (last words: {last[0][:200]})" if last else "")
        return [ProbeResult(n, "fail", why, seconds=round(time.monotonic() - started, 3)) for n in names]
    out = proc.stdout.split(MARKER, 1)
    if proc.returncode == 0 and len(out) == 2:
        return [ProbeResult(**r) for r in json.loads(out[1])]
    code = proc.returncode
    how = f"crashed ({signal.Signals(-code).name})" if code < 0 else f"exited with status {code}"
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    tail = " | ".join(lines[-3:])[-500:]
    return [ProbeResult(n, "fail", f"the probe's process {how}: {tail}", seconds=round(time.monotonic() - started, 3))
            for n in names]  # fmt: skip


def _gpu_probes(device_id: int, timeout_s: float) -> list[ProbeResult]:
    jobs: list[tuple[str, dict, list[str]]] = [("torch", {"device_id": device_id}, ["torch-cuda"]),
            ("dali-image", {"device_id": device_id}, ["dali-gpu", "nvjpeg", "nvjpeg-hw"])]  # fmt: skip
    jobs += [("nvdec", {"codec": c, "device_id": device_id}, [f"nvdec-{c}"]) for c in VIDEO_CODECS]
    jobs.append(("onnxruntime", {"device_id": device_id}, ["onnxruntime-cuda"]))
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(_child, probe, kwargs, names, timeout_s) for probe, kwargs, names in jobs]
        return [result for future in futures for result in future.result()]


def run_doctor(
    *, require_gpu: bool = False, device_id: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S, model: str | None = None
) -> DoctorReport:
    """Probe the GPU path and report what works, what falls back and why.

    Args:
        require_gpu: Count a machine without a GPU as a failure (exit status 1).
        device_id: The GPU to probe (among those CUDA shows this process).
        timeout_s: Time limit of each child probe.
        model: An exported model (``.onnx`` or a model folder) to run once in the server's session
            and report where onnxruntime placed its nodes (:mod:`gpufeed.doctor._placement`);
            on a machine without a GPU, on the CPU provider.

    Returns:
        The report; its ``exit_code`` is 1 when the GPU path is broken (or missing and required).
    """
    driver_result, driver, gpu = _driver()
    report = DoctorReport(gpu=gpu, require_gpu=require_gpu, results=[driver_result])
    files = InstalledSet(import_path_folders() or [Path(sysconfig.get_paths()["purelib"])])
    packages, stack = _packages(files, driver, gpu)
    report.results += [packages, _libraries(files, stack, gpu)]
    if not gpu:
        names = [
            "torch-cuda",
            "dali-gpu",
            "nvjpeg",
            "nvjpeg-hw",
            *(f"nvdec-{c}" for c in VIDEO_CODECS),
            "onnxruntime-cuda",
        ]
        report.results += [ProbeResult(n, "skip", "no NVIDIA GPU") for n in names]
    else:
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            report.results[0].details["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        report.results += _gpu_probes(device_id, timeout_s)
    if model is not None:
        # The probe's process runs in a folder of its own: a relative path is the caller's.
        kwargs = {"model": str(Path(model).resolve()), "device_id": device_id if gpu else None}
        report.results += _child("placement", kwargs, ["model-placement"], timeout_s)
    return report
