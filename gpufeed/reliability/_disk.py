"""Unwritable and full run folders: a clear error before training, and a disk that fills up mid-run.

``run_disk_faults(out)`` (``gpufeed reliability disk``) runs ``gpufeed train`` (in this process, as a
user would call it) against real failing file systems:

==================  ==============================================================================
case                how, and what is expected
==================  ==============================================================================
under a file        ``--out`` below a regular file (ENOTDIR): refused before training
read-only mount     ``--out`` inside a tmpfs mounted read-only (EROFS): refused before training
read-only folder    an existing run folder on that read-only tmpfs: refused before training
full disk           a 256 KiB tmpfs, less than one checkpoint: refused before training, naming the
                    free and the needed bytes
fills mid-run       a tmpfs with room for about 2.5 checkpoints, a checkpoint every step and
                    ``keep_checkpoints: 3``: the third write hits ENOSPC; the run stops with a clear
                    error, checkpoints 1 and 2 load, no temporary file is left; the tmpfs is then
                    grown and ``--resume`` finishes the run
==================  ==============================================================================

Root ignores permission bits, so "unwritable" must be a real read-only mount, and "full" a real
full file system. Those cases run in a child process inside a private mount namespace
(``unshare --mount``, or ``unshare --user --map-root-user --mount`` when not root), where it mounts
small tmpfs file systems on folders of ``out``; they vanish with the child and nobody else sees them.
Without ``unshare`` (or without the right to mount there) those cases are reported as not run, with
the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufeed.config import load_config
from gpufeed.core import Checklist, data_path, format_table, write_json
from gpufeed.models import create_model, list_checkpoints
from gpufeed.reliability._common import (
    ensure_synth,
    run_cli,
    step_records,
    tiny_train_mapping,
    write_train_yaml,
)
from gpufeed.train import build_optimizer, estimate_checkpoint_bytes

__all__ = ["DiskCase", "DiskReport", "namespace_command", "run_disk_faults"]

FULL_DISK_KIB = 256
_NAMESPACE_CASES = ("read-only mount", "read-only folder", "full disk", "fills mid-run")


@dataclass
class DiskCase:
    """One case: how ``gpufeed train`` ended.

    Attributes:
        name: The case (see the module docs).
        status: Exit status (2: stopped with an error).
        error: The error line the user sees.
        steps: Steps logged before the error (0: it came before training).
        seconds: From the command's start to its end.
        size_kib: Size of the tmpfs, when there was one.
        checkpoints: ``name: loads`` / ``name: reason`` for every checkpoint left (fills mid-run).
        temp_files_left: Temporary files of interrupted writes left behind (fills mid-run).
        resume_status, resumed_steps: The ``--resume`` after growing the tmpfs (fills mid-run).
    """

    name: str
    status: int
    error: str = ""
    steps: int = 0
    seconds: float = 0.0
    size_kib: int | None = None
    checkpoints: list[str] = field(default_factory=list)
    temp_files_left: int = 0
    resume_status: int | None = None
    resumed_steps: list[int] = field(default_factory=list)


@dataclass
class DiskReport(Checklist):
    """The cases that ran, and why the others did not."""

    cases: list[DiskCase]
    not_run: dict[str, str]
    mechanism: str

    def case(self, name: str) -> DiskCase:
        return next(c for c in self.cases if c.name == name)

    def checks(self) -> list[tuple[str, bool]]:
        """Each expectation of the module docs that ran, and whether it held."""
        words = {
            "under a file": ("cannot create the run folder", "Not a directory"),
            "read-only mount": ("cannot create the run folder", "Read-only file system"),
            "read-only folder": ("is not writable", "Read-only file system"),
            "full disk": ("not enough free space", " free, ", " needed for two checkpoints"),
            "fills mid-run": ("No space left on device", "is intact", "--resume"),
        }
        out = []
        for c in self.cases:
            named = all(w in c.error for w in words[c.name])
            out.append((f"{c.name}: exit 2 with a clear error", c.status == 2 and named))
            if c.name != "fills mid-run":
                out.append((f"{c.name}: before the first step", c.steps == 0))
                continue
            loads = [s for s in c.checkpoints if " loads " in s]
            out.append(("fills mid-run: every checkpoint left loads", bool(loads) and loads == c.checkpoints))
            out.append(("fills mid-run: no temporary file left", c.temp_files_left == 0))
            out.append(
                (
                    "fills mid-run: --resume finishes after the disk grows",
                    c.resume_status == 0 and c.resumed_steps == list(range(1, len(c.resumed_steps) + 1)),
                )
            )
        return out

    def table(self) -> str:
        rows = [
            [c.name, "" if c.size_kib is None else f"{c.size_kib} KiB", c.status, c.steps, f"{c.seconds:.1f}"]
            for c in self.cases
        ]
        lines = [
            f"unwritable and full run folders ({self.mechanism})",
            format_table(["case", "tmpfs", "exit", "steps before the error", "seconds to the error"], rows),
        ]
        for c in self.cases:
            lines.append(f"{c.name}: {c.error}")
        mid = next((c for c in self.cases if c.name == "fills mid-run"), None)
        if mid is not None:
            lines.append(
                f"fills mid-run: left {', '.join(mid.checkpoints) or 'no checkpoints'}; "
                f"{mid.temp_files_left} temporary file(s) left; after growing the tmpfs, --resume exited "
                f"{mid.resume_status} having logged steps {_span(mid.resumed_steps)}"
            )
        lines += [f"{name}: not run ({why})" for name, why in self.not_run.items()]
        lines.append(self.verdict())
        return "\n".join(lines)


def _span(steps: list[int]) -> str:
    return f"{steps[0]}..{steps[-1]}" if steps else "none"


def namespace_command() -> tuple[list[str] | None, str]:
    """The ``unshare`` prefix that gives a child its own mounts, or ``None`` and why it cannot."""
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if unshare is None or mount is None:
        return None, "unshare and mount (util-linux) are needed to mount a small tmpfs; not installed"
    prefix = [unshare, "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    with tempfile.TemporaryDirectory() as point:
        probe = subprocess.run(
            [*prefix, mount, "-t", "tmpfs", "-o", "size=64k", "tmpfs", point],
            capture_output=True,
            text=True,
            timeout=60,
        )
    if probe.returncode != 0:
        return None, f"'{' '.join(prefix)} mount -t tmpfs' failed here: {probe.stderr.strip() or probe.returncode}"
    return prefix, f"tmpfs in a private mount namespace: unshare {' '.join(prefix[1:])}"


def _mount(point: Path, options: str) -> None:
    subprocess.run([shutil.which("mount") or "mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], check=True)


def _remount(point: Path, options: str) -> None:
    subprocess.run([shutil.which("mount") or "mount", "-o", f"remount,{options}", str(point)], check=True)


def _train(config: Path, run_dir: Path, name: str, *extra: str, size_kib: int | None = None) -> DiskCase:
    outcome = run_cli("train", "--config", str(config), "--out", str(run_dir), *extra)
    return DiskCase(name, outcome.status, outcome.error, len(step_records(run_dir)), outcome.seconds, size_kib)


def _checkpoint_states(run_dir: Path) -> list[str]:
    import torch

    states = []
    for path in list_checkpoints(run_dir):
        try:
            step = int(torch.load(path, map_location="cpu", weights_only=True)["step"])
            states.append(f"{path.name} loads (step {step})")
        except Exception as err:  # any failure to load is the finding
            states.append(f"{path.name} does NOT load: {err}")
    return states


def _checkpoint_kib(config: Path) -> int:
    """The preflight's estimate of one checkpoint of the job, in KiB (sizes the tmpfs)."""
    cfg = load_config(config)
    train = cfg.data.train
    if train is None or train.list_file is None:  # the job this module writes always lists its images
        raise ValueError(f"{config}: the disk runs' job needs data.train.list_file")
    classes = (data_path(train.list_file).parent / "classes.txt").read_text(encoding="utf-8").split()
    model = create_model(cfg.model.name, num_classes=len(classes), size_px=cfg.image.size_px)
    return -(-estimate_checkpoint_bytes(model, build_optimizer(model, cfg.train)) // 1024)


def inside_namespace(work: str) -> None:
    """The mount cases; runs in a child inside a private mount namespace, results to ``work/inside.json``."""
    work_dir = Path(work)
    config = work_dir / "train.yaml"
    cases = []
    ro = work_dir / "mnt-read-only"
    _mount(ro, "size=1m")
    (ro / "existing-run").mkdir()
    _remount(ro, "ro")
    cases.append(_train(config, ro / "run", "read-only mount", size_kib=1024))
    cases.append(_train(config, ro / "existing-run", "read-only folder", size_kib=1024))

    full = work_dir / "mnt-full"
    _mount(full, f"size={FULL_DISK_KIB}k")
    cases.append(_train(config, full / "run", "full disk", size_kib=FULL_DISK_KIB))

    fill = work_dir / "mnt-fill"
    checkpoint_kib = _checkpoint_kib(config)
    size_kib = 2 * checkpoint_kib + checkpoint_kib // 2 + 64 + 16  # two checkpoints, logs, half a third
    _mount(fill, f"size={size_kib}k")
    run_dir = fill / "run"
    every = ("--set", "train.checkpoint_every_steps=1", "--set", "train.keep_checkpoints=3")
    case = _train(config, run_dir, "fills mid-run", *every, size_kib=size_kib)
    case.checkpoints = _checkpoint_states(run_dir)
    case.temp_files_left = len(list((run_dir / "checkpoints").glob(".ckpt-*.tmp-*")))
    _remount(fill, f"size={size_kib * 8}k")
    resumed = run_cli("train", "--config", str(config), "--out", str(run_dir), "--resume", *every)
    case.resume_status = resumed.status
    case.resumed_steps = [r["step"] for r in step_records(run_dir)]
    cases.append(case)
    write_json(work_dir / "inside.json", [asdict(c) for c in cases])


def run_disk_faults(out: str | Path, *, data: str | Path | None = None) -> DiskReport:
    """Run every case of the module docs in ``out`` (replacing an earlier run); return what happened.

    Args:
        out: Work folder: ``data/`` (unless ``data`` is given), the mount points, ``inside.log``.
        data: An existing ``gpufeed synth`` folder to train on.
    """
    out = Path(out)
    synth = ensure_synth(Path(data) if data else out / "data")
    for name in ("mnt-read-only", "mnt-full", "mnt-fill", "blocker", "inside.json"):
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    config = write_train_yaml(out / "train.yaml", tiny_train_mapping(synth, epochs=2, checkpoint_every_steps=0))
    (out / "blocker").write_text("a regular file, not a folder\n", encoding="utf-8")
    cases = [_train(config, out / "blocker" / "run", "under a file")]

    prefix, mechanism = namespace_command()
    if prefix is None:
        return DiskReport(cases, {name: mechanism for name in _NAMESPACE_CASES}, "no mount namespace")
    for name in ("mnt-read-only", "mnt-full", "mnt-fill"):
        (out / name).mkdir()
    code = f"from gpufeed.reliability._disk import inside_namespace; inside_namespace({str(out)!r})"
    with open(out / "inside.log", "w", encoding="utf-8") as log_file:
        child = subprocess.run(
            [*prefix, sys.executable, "-c", code], stdout=log_file, stderr=subprocess.STDOUT, timeout=600
        )
    if child.returncode != 0 or not (out / "inside.json").is_file():
        raise RuntimeError(f"the mount-namespace cases failed (exit {child.returncode}); see {out / 'inside.log'}")
    cases += [DiskCase(**c) for c in json.loads((out / "inside.json").read_text(encoding="utf-8"))]
    return DiskReport(cases, {}, mechanism)
