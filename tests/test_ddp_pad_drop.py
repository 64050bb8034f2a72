"""Ranks stay in step and weigh their rows right: empty shards under ``drop``, padding under DDP.

* Planning: a rank whose whole shard was found bad still plans as many batches as the others,
  under ``drop`` as under ``pad`` (a rank with none would leave the others' collectives unmatched).
* Loss: under ``last_batch: pad`` ranks hold different numbers of real rows; two real gloo ranks
  (child processes) take one DDP step each, and the averaged gradient must be the one a single
  process computes over the global batch's real rows (pixels, for the dense tasks).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gpufeed.pipelines._epoch_plan import plan_epoch
from gpufeed.pipelines._sampler import PlanSpec, PlanStream

# --- planning ----------------------------------------------------------------------------------


def _plan(k: int, shards: int, shuffle: bool, batch_size: int, policy: str, excluded=()):
    """Shard ``k``'s plan of epoch 1 of 64 samples."""
    return plan_epoch(
        np.arange(64),
        epoch=1,
        seed=3,
        shuffle=shuffle,
        shard_id=k,
        num_shards=shards,
        batch_size=batch_size,
        last_batch=policy,
        excluded=excluded,
    )


def _batches(policy: str, excluded_of, shuffle: bool, shards: int) -> list[int]:
    """Each shard's batch count in epoch 1 of 64 samples, shard ``k`` leaving out ``excluded_of(k)``."""
    return [_plan(k, shards, shuffle, 8, policy, excluded_of(k)).num_batches for k in range(shards)]


def _shard(k: int, shards: int, shuffle: bool) -> np.ndarray:
    """Shard ``k``'s samples in epoch 1, none excluded."""
    return _plan(k, shards, shuffle, 1, "partial").sample_ids


@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_an_emptied_shard_reads_usable_samples_and_under_drop_counts_them(policy):
    emptied = _shard(1, 2, shuffle=False)
    plan = _plan(1, 2, False, 8, policy, emptied)
    assert not np.isin(plan.sample_ids, emptied).any(), "a bad file is never read again"
    # drop has no padding rows (every row trains, as a short shard's repeats do); pad marks them.
    assert plan.valid.all() if policy == "drop" else not plan.valid.any()


def test_the_stream_of_an_emptied_shard_stays_on_the_others_epochs():
    """The stream skipped an empty epoch on that rank alone; now every rank's epoch 1 starts at the same step."""
    streams = []
    for k in (0, 1):
        excluded = _shard(1, 2, shuffle=True) if k == 1 else ()
        spec = PlanSpec(np.arange(64), 3, True, k, 2, 8, "drop", excluded=excluded)
        streams.append(PlanStream(spec, 1))
    assert [s.iterations_until(2) for s in streams] == [4, 4]


# --- the loss under DDP ------------------------------------------------------------------------

# Each rank: one Stepper step (SGD, lr 1) of a DDP model on its part of a global batch; it saves
# the step's gradient (weights before - after) and the loss the step reported.
RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    sys.path.insert(0, os.environ["TEST_DIR"])
    from test_ddp_pad_drop import global_batch, one_step, part_of

    rank = int(os.environ["RANK"])
    from datetime import timedelta
    # A TCP store on loopback with a deadline: a stalled rank fails in a minute instead of spinning
    # on (the file store's ranks were seen spinning for minutes beside other process tests).
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    out = {}
    for name in ("image", "segmentation", "depth"):
        task, model, batch = global_batch(name)
        out[name] = one_step(task, DistributedDataParallel(model), part_of(batch, lambda t: t[rank]))
    torch.save(out, os.environ["OUT"] + f"/rank{rank}.pt")
    dist.destroy_process_group()
    """
)

# Per rank (first axis): rank 0 holds 4 real rows, rank 1 one real row and 3 of padding.
VALID = torch.tensor([[True, True, True, True], [True, False, False, False]])


def global_batch(name: str):
    """(task, model, batch of fields shaped (ranks, rows, ...)) for ``name``; the same in every process."""
    from gpufeed.train._dense import DepthTask, SegmentationTask
    from gpufeed.train._tasks import ImageTask

    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(1)
    if name == "image":
        images = torch.randn(2, 4, 5, generator=gen)
        labels = torch.randint(0, 3, (2, 4), generator=gen)
        return ImageTask(3), torch.nn.Linear(5, 3), SimpleNamespace(images=images, labels=labels, valid=VALID)
    images = torch.randn(2, 4, 2, 6, 6, generator=gen)
    if name == "segmentation":
        mask = torch.randint(0, 3, (2, 4, 6, 6), generator=gen)
        mask[0, :, :3] = 255  # pixels counted differ from row to row too
        maps = {"mask": mask}
        task, model = SegmentationTask(3), torch.nn.Conv2d(2, 3, 1)
    else:
        depth = torch.randint(0, 50, (2, 4, 6, 6), generator=gen)  # 0: no measurement
        maps = {"depth": depth}
        task, model = DepthTask(depth_scale=0.1), torch.nn.Conv2d(2, 1, 1)
    return task, model, SimpleNamespace(images=images, maps=maps, valid=VALID)


def part_of(batch, take) -> dict:
    """The batch's fields, ``take`` applied to each tensor (the maps' too)."""
    return {
        field: {k: take(v) for k, v in value.items()} if isinstance(value, dict) else take(value)
        for field, value in vars(batch).items()
    }


def one_step(task, model, batch: dict) -> dict:
    """One Stepper step of ``model`` on ``batch``: its gradient and the loss it reported."""
    from gpufeed.train._step import Stepper

    bare = model.module if hasattr(model, "module") else model
    before = [p.detach().clone() for p in bare.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    stepper = Stepper(
        model, task, optimizer, scheduler, torch.nn.Identity(), torch.amp.GradScaler("cpu", enabled=False)
    )
    outcome = stepper(SimpleNamespace(**batch))
    grads = [b - p.detach() for b, p in zip(before, bare.parameters(), strict=True)]
    return {"grads": grads, "loss": outcome.loss}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.process  # two gloo ranks, child processes
@pytest.mark.timeout(180)
def test_a_ddp_step_with_padding_has_the_gradient_of_the_global_batchs_real_rows(tmp_path):
    env = {
        **os.environ,
        "TEST_DIR": os.path.dirname(__file__),
        "OUT": str(tmp_path),
        "WORLD_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "",
        "PORT": str(_free_port()),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT, encoding="utf-8")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [proc.communicate(timeout=150)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for name in ("image", "segmentation", "depth"):
        task, model, batch = global_batch(name)
        # One process, the whole global batch (8 rows, 5 of them real).
        expected = one_step(task, model, part_of(batch, lambda t: t.flatten(0, 1)))["grads"]
        for rank, out in enumerate(ranks):
            for got, want in zip(out[name]["grads"], expected, strict=True):
                assert torch.allclose(got, want, atol=1e-5), (name, rank, (got - want).abs().max().item())
            # The step reports this rank's own mean, as it did before the weighting.
            _, local, _ = global_batch(name)
            rows = SimpleNamespace(**part_of(batch, lambda t: t[rank]))  # noqa: B023
            with torch.no_grad():
                own = task.loss(local(rows.images), task.targets(rows), rows.valid)
            assert out[name]["loss"] == pytest.approx(float(own), rel=1e-5), (name, rank)
