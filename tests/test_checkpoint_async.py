"""Checkpoints written in the background: the training thread pays for a host copy, a thread for the write.

The slow disk is the environment, simulated: ``os.fsync`` held until the test (or a timer) lets it
go, ``os.replace`` failing, or ``GPUFEED_CHECKPOINT_CHUNK_DELAY_MS`` pausing a real process's
writes. The assertions are orderings (the call returned while the write was held), not timings.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from train_support import gpufeed_cmd, run_gpufeed, train_config, write_train_config

from gpufeed.models import create_model, load_model
from gpufeed.models._io import list_checkpoints
from gpufeed.train import _checkpoint, train
from gpufeed.train._checkpoint import CheckpointWriteFailed, CheckpointWriter, save_checkpoint
from gpufeed.train._loop import Loop
from gpufeed.train._telemetry import StepLog

pytestmark = pytest.mark.timeout(300)

_REAL_FSYNC = os.fsync
_REAL_REPLACE = os.replace


class HeldFsync:
    """``os.fsync`` of the temporary file of ``name`` waits until :meth:`release` (or ``until()`` holds)."""

    def __init__(self, name: str, until=None, timeout_s: float = 60.0) -> None:
        self.name, self.until, self.timeout_s = name, until, timeout_s
        self.entered, self.released = threading.Event(), threading.Event()
        self.let_go_by: str | None = None  # "test", "condition" or "timeout"

    def release(self) -> None:
        self.let_go_by = self.let_go_by or "test"
        self.released.set()

    def __call__(self, fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if f".{self.name}.tmp-" in target and not self.entered.is_set():
            self.entered.set()
            deadline = time.monotonic() + self.timeout_s
            while not self.released.is_set() and time.monotonic() < deadline:
                if self.until is not None and self.until():
                    self.let_go_by = "condition"
                    break
                self.released.wait(0.01)
            self.let_go_by = self.let_go_by or "timeout"
        _REAL_FSYNC(fd)


def _failing_replace(name: str, calls: list):
    def replace(src, dst, *args, **kwargs):
        calls.append(Path(dst).name)
        if Path(dst).name == name:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(src))
        return _REAL_REPLACE(src, dst, *args, **kwargs)

    return replace


def _state(seed: int = 0) -> tuple[dict, torch.nn.Module]:
    """A model and AdamW state after a step, with what a real payload holds besides (views, lists, ints)."""
    torch.manual_seed(seed)
    model = create_model("smallcnn", num_classes=4, size_px=32).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8)).sum().backward()
    optimizer.step()
    shared = torch.arange(12.0)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "views": [shared[2:5], shared.view(3, 4).t(), torch.zeros(0), torch.tensor(True)],
        "rng": [{"torch": torch.get_rng_state(), "cuda": None}],
        "step": 7,
        "config": {"train": {"lr": 0.01, "betas": (0.9, 0.999)}},
    }, model


def _assert_same(a, b, where: str = "") -> None:
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), where
        # exact: a file's tensors against the state they were copied from, byte for byte
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        assert getattr(a, "_metadata", None) == getattr(b, "_metadata", None), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


# -- the writer -------------------------------------------------------------------------------------


def test_a_checkpoint_call_returns_while_its_write_is_held_and_saves_the_state_of_its_step(tmp_path, monkeypatch):
    payload, model = _state()
    expected = _load(save_checkpoint(payload, tmp_path / "sync", 7))
    held = HeldFsync("ckpt-000000007.pt")
    monkeypatch.setattr(os, "fsync", held)
    writer = CheckpointWriter()

    path = writer.submit(payload, tmp_path, 7)
    assert held.entered.wait(60), "the write reached its fsync on the writer's thread"
    assert not held.released.is_set(), "the call returned while the write was held"
    assert writer.writing == path and not path.exists(), "nothing under the final name before the rename"
    (thread,) = [t for t in threading.enumerate() if t.name == "gpufeed checkpoint 7"]
    assert not thread.daemon, "an interpreter exiting without wait() still lets the write finish"
    with torch.no_grad():  # the next steps change the state in place while the write goes on
        for p in model.parameters():
            p.add_(1.0)
    held.release()

    assert writer.wait() == path and path.is_file() and writer.writing is None
    assert held.let_go_by == "test"
    _assert_same(_load(path), expected)
    assert writer.wait() is None, "nothing left to wait for"


def test_the_file_is_byte_for_byte_a_synchronous_save_of_the_same_state(tmp_path):
    payload, _ = _state(seed=1)
    writer = CheckpointWriter()
    for step in (1, 2):  # the second reuses the first's host buffers
        writer.submit(payload, tmp_path / "async", step)
        written = writer.wait()
        assert written is not None
        synchronous = save_checkpoint(payload, tmp_path / "sync", step)
        assert written.read_bytes() == synchronous.read_bytes()
        loaded = _load(written)
        _assert_same(loaded, _load(synchronous))
        _assert_same(loaded, payload)
    shared = loaded["views"]
    assert shared[0].untyped_storage().data_ptr() == shared[1].untyped_storage().data_ptr(), "views share as saved"


def test_one_write_at_a_time_the_next_checkpoint_waits_for_the_previous(tmp_path, monkeypatch):
    payload, _ = _state()
    held = HeldFsync("ckpt-000000001.pt")
    monkeypatch.setattr(os, "fsync", held)
    writer = CheckpointWriter()
    writer.submit(payload, tmp_path, 1)
    assert held.entered.wait(60)
    timer = threading.Timer(0.3, held.release)  # the slow disk lets the first write go on its own
    timer.start()
    try:
        writer.submit(payload, tmp_path, 2)
        assert (tmp_path / "checkpoints" / "ckpt-000000001.pt").is_file(), "the second started after the first ended"
        assert len([t for t in threading.enumerate() if t.name.startswith("gpufeed checkpoint")]) <= 1
    finally:
        timer.cancel()
        held.release()
    assert writer.wait() == tmp_path / "checkpoints" / "ckpt-000000002.pt"


def test_a_failed_write_is_raised_at_the_next_checkpoint_in_one_line_naming_it(tmp_path, monkeypatch):
    payload, _ = _state()
    writer = CheckpointWriter()
    writer.submit(payload, tmp_path, 1, keep=2)
    writer.wait()
    calls: list[str] = []
    monkeypatch.setattr(os, "replace", _failing_replace("ckpt-000000002.pt", calls))
    path = writer.submit(payload, tmp_path, 2, keep=2)  # returns: the failure comes on the thread

    with pytest.raises(CheckpointWriteFailed) as info:
        writer.submit(payload, tmp_path, 3, keep=2)
    assert str(info.value).startswith(f"cannot write checkpoint {path}: [Errno 5] Input/output error")
    assert info.value.path == path and isinstance(info.value.error, OSError) and "\n" not in str(info.value)
    assert calls == ["ckpt-000000002.pt"], "the third was not started"
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-000000001.pt"], "the previous one is untouched"
    assert not list((tmp_path / "checkpoints").glob(".ckpt-*")), "no temporary file is left"
    assert _load(tmp_path / "checkpoints" / "ckpt-000000001.pt")["step"] == 7
    assert writer.wait() is None, "reported once"


class _DiskFillsAt:
    """A file whose writes fail with ENOSPC past ``room`` bytes: a disk that fills during the write."""

    def __init__(self, path, mode: str, room: int) -> None:
        self._fh, self.room = open(path, mode), room  # noqa: SIM115  # closed by __exit__

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return self._fh.write(data)

    def __getattr__(self, name: str):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()


def test_a_disk_filling_during_the_write_is_no_space_left_not_a_serialiser_error(tmp_path, monkeypatch):
    """torch.save into a file turns the file's OSError into "unexpected pos": the errno must come through."""
    payload, _ = _state()
    monkeypatch.setattr(_checkpoint, "open", lambda path, mode: _DiskFillsAt(path, mode, 50_000), raising=False)
    writer = CheckpointWriter()
    path = writer.submit(payload, tmp_path, 1)
    with pytest.raises(CheckpointWriteFailed) as info:
        writer.wait()
    assert isinstance(info.value.error, OSError) and info.value.error.errno == errno.ENOSPC
    assert str(info.value) == f"cannot write checkpoint {path}: [Errno 28] No space left on device"
    assert not list((tmp_path / "checkpoints").iterdir()), "neither the checkpoint nor its temporary file"


def test_a_checkpoint_larger_than_the_free_space_is_refused_before_the_copy(tmp_path, monkeypatch):
    payload, _ = _state()
    real = os.statvfs(tmp_path)

    class Full:  # the file system's answer, with a few blocks left
        f_frsize, f_bfree = real.f_frsize, 2

    monkeypatch.setattr(os, "statvfs", lambda path: Full)
    with pytest.raises(OSError) as info:
        CheckpointWriter().submit(payload, tmp_path, 1)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(
        tmp_path / "checkpoints" / "ckpt-000000001.pt"
    )
    assert not any(t.name.startswith("gpufeed checkpoint") for t in threading.enumerate())
    assert not list((tmp_path / "checkpoints").iterdir())


@pytest.mark.gpu
def test_device_state_is_copied_behind_the_step_into_reused_pinned_buffers(tmp_path, monkeypatch):
    payload, model = _state()
    model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    model(torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8, device="cuda")).sum().backward()
    optimizer.step()
    payload = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}
    params = list(model.parameters())
    with torch.no_grad():  # the state the checkpoint must hold: the weights doubled (exact, as is halving)
        torch._foreach_mul_(params, 2.0)
        expected = _load(save_checkpoint(payload, tmp_path / "sync", 2))
        torch._foreach_div_(params, 2.0)
    writer = CheckpointWriter()
    writer.submit(payload, tmp_path, 1)  # the pinned buffers made (allocating pinned memory may synchronise)
    writer.wait()
    buffers = [b.data_ptr() for b in writer._buffers]
    assert all(b.is_pinned() for b in writer._buffers if b.nbytes())
    held = HeldFsync("ckpt-000000002.pt")
    monkeypatch.setattr(os, "fsync", held)
    torch.cuda._sleep(int(1e9))  # about a second of GPU time: the doubling below runs after it
    with torch.no_grad():
        torch._foreach_mul_(params, 2.0)
    writer.submit(payload, tmp_path, 2)
    # The copies were queued behind the doubling without a wait: a writer reading its buffers before
    # they arrive, or copies on another stream, would write other bytes than expected.
    assert not torch.cuda.current_stream().query(), "submit waited for the GPU"
    with torch.no_grad():  # queued behind the copies on the same stream: the snapshot is the step's
        for p in params:
            p.mul_(3.0).add_(1.0)
    held.release()
    written = writer.wait()
    assert written is not None
    _assert_same(_load(written), expected)  # exact: the same bytes copied from the device, both sides
    assert [b.data_ptr() for b in writer._buffers] == buffers, "the pinned buffers are kept for the next checkpoint"


# -- in a training run ------------------------------------------------------------------------------


def _logged_steps(run: Path) -> list[int]:
    """The steps in the step log, read while it is written: a last line without its newline is left out."""
    log = run / "steps.jsonl"
    return [json.loads(line)["step"] for line in log.read_text().split("\n")[:-1]] if log.is_file() else []


@pytest.mark.process
def test_training_goes_on_while_a_checkpoint_is_written(synth_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    # The write of step 2's checkpoint is held until step 3 is logged: a synchronous write would wait forever.
    held = HeldFsync("ckpt-000000002.pt", until=lambda: 3 in _logged_steps(run))
    monkeypatch.setattr(os, "fsync", held)
    cfg = train_config(synth_dir, ["train.max_steps=4", "train.checkpoint_every_steps=2", "train.eval_every_epochs=0"])
    result = train(cfg, run)

    assert held.let_go_by == "condition", "step 3 trained while checkpoint 2 was being written"
    assert [p.name for p in list_checkpoints(run)] == ["ckpt-000000002.pt", "ckpt-000000004.pt"]
    assert result.checkpoint == run / "checkpoints" / "ckpt-000000004.pt"
    assert _load(result.checkpoint)["step"] == 4 and (run / "summary.json").is_file()
    assert load_model(run) is not None


@pytest.mark.process
@pytest.mark.parametrize(("failing", "when"), [(2, "at the next checkpoint"), (3, "at the end")])
def test_a_failed_write_ends_the_run_with_one_line_and_exit_status_2(
    synth_dir, tmp_path, monkeypatch, capsys, failing, when
):
    from gpufeed.cli import main

    config, run = write_train_config(tmp_path / "train.yaml", synth_dir), tmp_path / "run"
    calls: list[str] = []
    monkeypatch.setattr(os, "replace", _failing_replace(f"ckpt-{failing:09d}.pt", calls))
    args = ["train", "--config", str(config), "--out", str(run), "--set", "train.max_steps=3"]
    status = main([*args, "--set", "train.checkpoint_every_steps=1", "--set", "train.eval_every_epochs=0"])

    assert status == 2, when
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1, f"one line, no traceback: {lines}"
    folder = run / "checkpoints"
    assert lines[0].startswith(f"gpufeed train: error: cannot write checkpoint {folder / f'ckpt-{failing:09d}.pt'}: ")
    assert "Input/output error" in lines[0] and f"{folder / f'ckpt-{failing - 1:09d}.pt'}, is intact" in lines[0]
    assert [p.name for p in list_checkpoints(run)] == [f"ckpt-{s:09d}.pt" for s in range(1, failing)]
    assert not list(folder.glob(".ckpt-*")), "no temporary file is left"
    assert _logged_steps(run) == [1, 2, 3], "reported at the checkpoint after the failed one, or at the end"
    assert not (run / "summary.json").exists(), "a run whose checkpoint failed is not finished"


@pytest.mark.process
def test_an_error_in_training_waits_for_the_write_and_logs_its_failure(synth_dir, tmp_path, monkeypatch, caplog):
    run = tmp_path / "run"
    held = HeldFsync("ckpt-000000002.pt")
    monkeypatch.setattr(os, "fsync", held)
    monkeypatch.setattr(os, "replace", _failing_replace("ckpt-000000002.pt", []))
    seen_at_close: list[bool] = []
    real_close = StepLog.close

    def close(self) -> None:
        seen_at_close.append(held.let_go_by is not None and not list((run / "checkpoints").glob(".ckpt-*")))
        real_close(self)

    def evaluate(self, epoch):  # the run's own error, raised after checkpoint 2 was handed to the writer
        assert held.entered.wait(60)
        threading.Timer(0.3, held.release).start()  # the slow disk finishes on its own
        raise RuntimeError("boom")

    monkeypatch.setattr(StepLog, "close", close)
    monkeypatch.setattr(Loop, "evaluate", evaluate)
    cfg = train_config(synth_dir, ["train.max_steps=2", "train.checkpoint_every_steps=2"])
    with pytest.raises(RuntimeError, match="boom"):
        train(cfg, run)

    assert seen_at_close and seen_at_close[0], "the session waited for the write before closing"
    failures = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(failures) == 1 and failures[0].startswith(
        f"cannot write checkpoint {run / 'checkpoints'}/ckpt-000000002.pt"
    )
    assert "\n" not in failures[0] and not list_checkpoints(run)


@pytest.mark.process
def test_kill_9_during_a_background_write_keeps_the_previous_checkpoint(synth_dir, tmp_path):
    config, run = write_train_config(tmp_path / "train.yaml", synth_dir), tmp_path / "run"
    args = ["train", "--config", str(config), "--out", str(run), "--set", "train.checkpoint_every_steps=2"]
    env = {**os.environ, "GPUFEED_CHECKPOINT_CHUNK_DELAY_MS": "1000"}  # a slow disk: each 256 KiB chunk pauses 1 s
    proc = subprocess.Popen(gpufeed_cmd(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = run / "checkpoints"
    temp = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            temp = next((p for p in folder.glob(".ckpt-000000004.pt.tmp-*") if p.stat().st_size > 0), None)
            # Killed while checkpoint 4 is written and step 5 already trained: the write is in the background.
            if temp is not None and (folder / "ckpt-000000002.pt").is_file() and 5 in _logged_steps(run):
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        proc.kill()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"not killed mid-write:\n{out}\n{err}"
    assert temp is not None and temp.exists(), "killed mid-write: the partial temporary file is still there"
    assert [p.name for p in list_checkpoints(run)] == ["ckpt-000000002.pt"], "no partial file under the final name"
    assert _load(folder / "ckpt-000000002.pt")["step"] == 2

    resumed = run_gpufeed("train", "--config", str(config), "--out", str(run), "--resume", "--set", "train.max_steps=6")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr and "step 2" in resumed.stderr and not temp.exists()
    assert list_checkpoints(run)[-1].name == "ckpt-000000006.pt"
    assert _logged_steps(run) == [1, 2, 3, 4, 5, 6], "the steps after checkpoint 2 are logged once, not twice"


def test_a_failure_that_is_not_an_os_error_is_one_line_naming_the_file():
    failed = CheckpointWriteFailed(Path("/run/checkpoints/ckpt-000000003.pt"), TypeError("cannot pickle 'x'\nmore"))
    assert str(failed) == "cannot write checkpoint /run/checkpoints/ckpt-000000003.pt: cannot pickle 'x'"
