"""Ranks that disagree on the device stop with an error naming them, instead of hanging in NCCL.

Two real processes rendezvous through a real TCP store on this machine, as torchrun's ranks do.
In the disagreement test one rank is made to claim a GPU inside its own process (``resolve_device``
sees one visible device whose probe passes), the way a rank with a working GPU would resolve,
while the other resolves ``auto`` honestly on this CPU-only machine. Without the check, the CPU
rank would wait in gloo's rendezvous for a peer that is waiting for NCCL's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.process  # ranks are real child processes

# Each rank: resolve the device as training does, join the job, then prove the group works.
RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    import torch.distributed as dist
    from gpufeed import device as device_module
    from gpufeed.train._distributed import env_dist_info, init_distributed

    info = env_dist_info()
    if os.environ.get("CLAIM_GPU") == "1":  # this rank sees a working GPU (the test's stand-in for one)
        device_module._visible_cuda_devices = lambda: 1
        device_module.cuda_status = lambda index=0: (True, "a GPU claimed by the test")
    choice = device_module.resolve_device(os.environ["REQUEST"], info.local_rank, info.world_size)
    init_distributed(info, choice.is_gpu, timeout_s=60, device_index=choice.device_id,
                     device=choice.describe(), agree_timeout_s=20)
    total = torch.tensor([info.rank + 1.0])
    dist.all_reduce(total)
    print(f"rank {info.rank} joined on {dist.get_backend()}: sum {total.item():g}", flush=True)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_ranks(tmp_path, claims: list[bool], timeout_s: float = 90.0, requests=None) -> list[tuple[int, str]]:
    """Start one process per rank; (exit code, output) of each, killing any still running at the timeout.

    Args:
        claims: Per rank, whether it is made to see a working GPU (with no GPU visible otherwise).
        requests: Per rank, its ``device`` setting, with the machine's own GPUs visible (real GPUs).
    """
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT, encoding="utf-8")
    port = _free_port()
    procs = []
    for rank, claim in enumerate(claims):
        env = {
            **os.environ,
            "RANK": str(rank),
            # One rank per node, as in the case this guards: a node without a GPU in a GPU job.
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(len(claims)),
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "CLAIM_GPU": "1" if claim else "0",
            "REQUEST": requests[rank] if requests else "auto",
        }
        if not requests:
            env["CUDA_VISIBLE_DEVICES"] = ""
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    deadline = time.monotonic() + timeout_s
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            out, _ = proc.communicate()
            raise AssertionError(f"a rank still ran after {timeout_s:g} s (hung):\n{out}") from None
        results.append((proc.returncode, out))
    return results


def test_ranks_that_agree_join_the_group(tmp_path):
    results = _run_ranks(tmp_path, [False, False])
    for rank, (code, out) in enumerate(results):
        assert code == 0, out
        assert f"rank {rank} joined on gloo: sum 3" in out


def test_a_cpu_rank_beside_a_gpu_rank_fails_both_naming_ranks_and_devices(tmp_path):
    started = time.monotonic()
    results = _run_ranks(tmp_path, [False, True])
    took = time.monotonic() - started
    for code, out in results:
        assert code != 0, out
        assert "DeviceUnavailableError: the ranks disagree on the device" in out, out
        assert "rank 0 on " in out and "cpu (device: auto fell back to the CPU" in out, out
        assert "rank 1 on " in out and "cuda:0 (device: auto; a GPU claimed by the test)" in out, out
        assert "Give rank(s) 0 a usable GPU" in out, out
        assert "joined" not in out
    # Well inside the agreement's own 20 s limit: the disagreement is seen as soon as both reported.
    assert took < 60, f"took {took:.0f} s"


def test_a_rank_that_never_reports_is_named_within_the_timeout(tmp_path):
    """A store that only rank 0 writes to: the check stops after its timeout naming the silent rank."""
    import torch.distributed as dist

    from gpufeed.device import DeviceUnavailableError
    from gpufeed.train._distributed import DistInfo, agree_on_device

    store = dist.TCPStore("127.0.0.1", _free_port(), 1, True, wait_for_workers=False)
    started = time.monotonic()
    try:
        agree_on_device(store, DistInfo(0, 3, 0), "cpu", False, timeout_s=2)
    except DeviceUnavailableError as err:
        assert "rank(s) 1, 2 did not report it" in str(err)
    else:
        raise AssertionError("no error although ranks 1 and 2 never reported")
    assert time.monotonic() - started < 30


@pytest.mark.gpu
def test_a_cpu_rank_beside_a_real_gpu_rank_fails_both(tmp_path):
    """On a GPU machine, without any stand-in: rank 0 resolves auto to its GPU, rank 1 is set to the CPU."""
    results = _run_ranks(tmp_path, [False, False], requests=["auto", "cpu"])
    for code, out in results:
        assert code != 0, out
        assert "the ranks disagree on the device" in out, out
        assert "rank 0 on " in out and ": cuda:0 (device: auto;" in out, out
        assert "rank 1 on " in out and "cpu (device: cpu was requested)" in out, out
