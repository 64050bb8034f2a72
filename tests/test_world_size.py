"""Every sample exactly once at any world size: plans, loaders resumed on other rank counts, the agreement check.

The ranks of a job are loaders built with explicit shards here (``shard_id``/``num_shards``), in
one process; the real multi-process runs are in ``test_world_size_process.py``.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections import Counter

import numpy as np
import pytest
import torch.distributed as dist

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import DatasetError, ImageDataset, ImageLoader
from gpufeed.pipelines._dense_loader import DenseLoader
from gpufeed.pipelines._pairs import PairedDataset
from gpufeed.pipelines._sampler import Segment, consumed_in_share, plan_epoch
from gpufeed.pipelines._shares import coverage_problem, share_report
from gpufeed.synth._pairs import write_paired_split
from gpufeed.train._agreement import agree_on_data
from gpufeed.train._distributed import DistInfo
from gpufeed.train._telemetry import StepLog, StepRecord, cut_logs_of_missing_ranks

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
ARGS = {"epoch": 3, "seed": 7, "shuffle": True}


def _plans(n: int, size: int, batch: int, policy: str, *, start: int, history: tuple, excluded=None) -> list:
    return [
        plan_epoch(
            np.arange(size),
            **ARGS,
            shard_id=k,
            num_shards=n,
            batch_size=batch,
            last_batch=policy,
            start_batch=start,
            history=history,
            excluded=(excluded or {}).get(k, ()),
        )
        for k in range(n)
    ]


def _read_chain(size: int, chain: tuple[int, ...], batch: int, policy: str, rng, bad=frozenset()) -> tuple[list, list]:
    """Read one epoch in segments of ``chain`` ranks, each stopped at a random batch (the last one runs out).

    Returns (real rows read, every plan's batch count per segment). Each rank leaves out the bad
    ids of its own share, as a rank that found them bad while reading does.
    """
    history: tuple = ()
    start, read, counts = 0, [], []
    for i, n in enumerate(chain):
        plans = _plans(n, size, batch, policy, start=start, history=history)
        excluded = {k: sorted(bad & set(p.sample_ids.tolist())) for k, p in enumerate(plans)}
        plans = _plans(n, size, batch, policy, start=start, history=history, excluded=excluded)
        counts.append({p.num_batches for p in plans})
        end = max(p.num_batches for p in plans)
        stop = end if i == len(chain) - 1 else int(rng.integers(start, end + 1))
        for p in plans:
            rows = slice(0, (stop - start) * batch)
            read += p.sample_ids[rows][p.valid[rows]].tolist()
        consumed = [
            consumed_in_share(
                np.arange(size),
                **ARGS,
                shard_id=k,
                num_shards=n,
                batch_size=batch,
                batch=stop,
                history=history,
                excluded=excluded[k],
            )
            for k in range(n)
        ]
        history, start = (*history, Segment(n, tuple(consumed), stop)), stop
    return read, counts


CHAINS = [(4, 2), (2, 1), (1, 2), (4, 2, 1), (3, 2, 4), (2, 2)]


@pytest.mark.parametrize("policy", ["pad", "partial"])
@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: "-".join(map(str, c)))
def test_any_chain_of_world_sizes_reads_every_sample_once(chain, policy):
    rng = np.random.default_rng(len(chain) * 10 + chain[0])
    for size, batch in itertools.product([96, 37, 5], [4, 5]):
        for _ in range(3):
            read, counts = _read_chain(size, chain, batch, policy, rng)
            assert sorted(read) == list(range(size)), (size, batch)
            if policy == "pad":
                assert all(len(c) == 1 for c in counts), f"pad: every rank of a segment runs the same steps {counts}"


def test_skipped_files_are_left_out_and_every_other_sample_is_read_once():
    rng = np.random.default_rng(3)
    for chain, policy in itertools.product(CHAINS, ["pad", "partial"]):
        bad = frozenset(rng.choice(61, 4, replace=False).tolist())
        read, _ = _read_chain(61, chain, 4, policy, rng, bad)
        assert sorted(x for x in read if x not in bad) == sorted(set(range(61)) - bad), (chain, policy)


@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: "-".join(map(str, c)))
def test_drop_reads_each_sample_at_most_once_and_the_tail_sits_out(chain):
    rng = np.random.default_rng(1)
    for size in (96, 37, 50):
        read, counts = _read_chain(size, chain, 4, "drop", rng)
        assert len(read) == len(set(read)), "no sample twice"
        assert all(len(c) == 1 for c in counts), "equal steps on every rank"
        order = plan_epoch(np.arange(size), **ARGS, shard_id=0, num_shards=1, batch_size=1, last_batch="partial")
        sat_out = [int(i) for i in order.sample_ids if int(i) not in set(read)]
        assert len(sat_out) < chain[-1] * 4, f"only what the last world size cannot even out sits out: {sat_out}"


def test_the_global_order_does_not_depend_on_the_world_size():
    whole = plan_epoch(np.arange(40), **ARGS, shard_id=0, num_shards=1, batch_size=4, last_batch="partial")
    for n in (2, 4, 5):
        shares = _plans(n, 40, 2, "partial", start=0, history=())
        interleaved = [int(s.sample_ids[i]) for i in range(8) for s in shares]
        assert interleaved == whole.sample_ids[: 8 * n].tolist(), "shard k takes every n-th of one order"


# -- loaders -----------------------------------------------------------------------------------------
def _loader(cls, dataset, k: int, n: int, batch: int, policy: str):
    return cls(
        dataset,
        train=True,
        image_cfg=ImagePipelineConfig(size_px=16),
        loader_cfg=LoaderConfig(batch_size=batch, last_batch=policy, num_threads=1),
        device=CPU,
        seed=3,
        shard_id=k,
        num_shards=n,
    )


def _image_loader(dataset, k: int, n: int, batch: int = 5, policy: str = "pad") -> ImageLoader:
    return _loader(ImageLoader, dataset, k, n, batch, policy)


def _dense_loader(dataset, k: int, n: int, batch: int = 2, policy: str = "pad") -> DenseLoader:
    return _loader(DenseLoader, dataset, k, n, batch, policy)


def _take(loader, batches: int) -> list[int]:
    """The real (non-padding) sample ids of the next ``batches`` batches (all that remain: None)."""
    got = []
    for i, batch in enumerate(loader):
        got += batch.sample_ids[batch.valid].tolist()
        if batches is not None and i + 1 == batches:
            break
    return got


def _resume_across(make, dataset, old: int, new: int, stop: int, epoch: int = 1) -> Counter:
    """Read ``stop`` batches of ``epoch`` on ``old`` ranks, resume on ``new`` from all their states, read the rest."""
    before = [make(dataset, k, old) for k in range(old)]
    read = Counter()
    for loader in before:
        loader.set_epoch(epoch)
        read.update(_take(loader, stop))
    states = [loader.state_dict() for loader in before]
    for loader in before:
        loader.close()
    assert all(s["epoch"] == epoch and s["batch"] == stop for s in states)
    after = [make(dataset, k, new) for k in range(new)]
    for loader in after:
        loader.load_state_dict(states)
        assert loader.state_dict()["batch"] == stop, "batches count on from where the epoch stood"
        assert len(loader) > stop and loader.state_dict()["history"][0]["shards"] == old
        read.update(_take(loader, None))
        assert loader.epoch == epoch + 1, "then the next epoch, on the new ranks alone"
        loader.close()
    return read


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from gpufeed.synth import SynthSpec, write_synthetic_dataset

    root = write_synthetic_dataset(tmp_path_factory.mktemp("world"), SynthSpec(), progress=False)
    return ImageDataset.from_list(root / "images" / "train.txt")


@pytest.mark.parametrize(("old", "new", "stop"), [(4, 2, 2), (2, 1, 3), (1, 2, 7)])
def test_image_loaders_resumed_on_another_world_size_read_each_image_once(images, old, new, stop):
    read = _resume_across(_image_loader, images, old, new, stop)
    assert sorted(read) == list(range(len(images))) and set(read.values()) == {1}


def test_dense_loaders_resumed_on_another_world_size_read_each_pair_once(tmp_path):
    pairs = PairedDataset.from_root(write_paired_split(tmp_path / "train", 11, 48, 36, seed=2))
    read = _resume_across(_dense_loader, pairs, 2, 1, 2)
    assert sorted(read) == list(range(11)) and set(read.values()) == {1}


def test_a_state_list_of_the_same_world_size_is_this_ranks_own_state(images):
    stopped = [_image_loader(images, k, 2) for k in range(2)]
    states = []
    for loader in stopped:
        _take(loader, 2)
        states.append(loader.state_dict())
        loader.close()
    own = _image_loader(images, 1, 2)
    own.load_state_dict(states)
    assert own.state_dict() == states[1] and states[1]["history"] == [], "no resharding: exactly where it stood"
    with pytest.raises(ValueError, match="shard 0 of 2 given to shard 1 of 2"):
        _image_loader(images, 1, 2).load_state_dict(states[0])
    with pytest.raises(ValueError, match="stand at different places"):
        _image_loader(images, 0, 1).load_state_dict([states[0], {**states[1], "batch": 3}])


# -- the agreement check -------------------------------------------------------------------------------
def _agree(loaders_per_rank: list[dict]) -> list[BaseException | None]:
    """Run the check for every rank at once over one in-process store; what each rank raised."""
    store = dist.HashStore()
    n = len(loaders_per_rank)
    outcome: list[BaseException | None] = [None] * n

    def rank(r: int) -> None:
        try:
            agree_on_data(store, DistInfo(r, n, 0), loaders_per_rank[r], timeout_s=20)
        except BaseException as err:  # handed to the test
            outcome[r] = err

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcome


def test_ranks_with_the_same_view_agree(images):
    assert _agree([{"train": _image_loader(images, r, 2), "val": None} for r in range(2)]) == [None, None]


def test_a_rank_with_another_file_list_stops_every_rank_naming_each_view(images):
    fewer = ImageDataset(
        images.paths[:-1], images.labels[:-1], images.sizes[:-1], images.classes, source="list file elsewhere"
    )
    outcome = _agree([{"train": _image_loader(images, 0, 2)}, {"train": _image_loader(fewer, 1, 2)}])
    messages = {str(err) for err in outcome}
    assert all(isinstance(err, DatasetError) for err in outcome) and len(messages) == 1, outcome
    message = messages.pop()
    assert "\n" not in message
    assert message.startswith("the ranks disagree on the training data (index), so their shares would not cover")
    assert f"rank 0 on {socket.gethostname()}: index " in message and "96 samples, list file" in message
    assert f"rank 1 on {socket.gethostname()}: index " in message and "95 samples, list file elsewhere" in message


def test_another_seed_on_one_rank_is_named(images):
    other = ImageLoader(
        images,
        train=True,
        image_cfg=ImagePipelineConfig(size_px=16),
        loader_cfg=LoaderConfig(batch_size=5, last_batch="pad", num_threads=1),
        device=CPU,
        seed=4,
        shard_id=1,
        num_shards=2,
    )
    outcome = _agree([{"train": _image_loader(images, 0, 2)}, {"train": other}])
    assert all(isinstance(err, DatasetError) for err in outcome)
    assert "(settings)" in str(outcome[0]) and "seed 3, shuffle on" in str(outcome[0]) and "seed 4" in str(outcome[1])


def test_shares_that_overlap_are_refused(images):
    outcome = _agree([{"train": _image_loader(images, 0, 2)}, {"train": _image_loader(images, 0, 2)}])
    assert all(isinstance(err, DatasetError) for err in outcome)
    assert "do not cover epoch 1 exactly once: the ranks' shards are not 0..1 of 2" in str(outcome[0])
    assert ", shard 0 of 2; rank 1 on " in str(outcome[0]) and str(outcome[0]).endswith(", shard 0 of 2")


def test_shares_that_leave_samples_out_are_refused(images):
    """Right shard numbers, wrong rows: the digests of the shares do not add up to the epoch's."""
    reports = [share_report(_image_loader(images, k, 2)) for k in range(2)]
    assert coverage_problem(reports, _image_loader(images, 0, 2)) is None
    reports[1] = {**reports[1], "rows_digest": str((int(reports[1]["rows_digest"]) + 1) % 2**64)}
    problem = coverage_problem(reports, _image_loader(images, 0, 2))
    assert problem is not None and "call for 96 distinct ones under last_batch 'pad'" in problem


def test_padding_rows_are_marked_in_the_step_log_and_missing_ranks_logs_are_cut(tmp_path):
    record = StepRecord(3, 0, 2, 0, 0.0, 0, 0, 0, 0, 5, 0.5, 1e-3, sample_ids=[4, 5, 6, 4, 5], padding_rows=[3, 4])
    assert json.loads(record.to_json())["padding_rows"] == [3, 4]
    assert "padding_rows" not in json.loads(StepRecord(1, 0, 0, 0, 0.0, 0, 0, 0, 0, 5, 0.5, 1e-3).to_json())
    for rank in (0, 1, 2, 3):
        name = "steps.jsonl" if rank == 0 else f"steps-rank{rank}.jsonl"
        log = StepLog(tmp_path / name)
        for step in (1, 2, 3):
            log.write({"step": step, "rank": rank})
        log.close()
    cut = cut_logs_of_missing_ranks(tmp_path, 2, 2)
    assert [p.name for p in cut] == ["steps-rank2.jsonl", "steps-rank3.jsonl"]
    steps = {p.name: [json.loads(x)["step"] for x in p.read_text().splitlines()] for p in tmp_path.glob("*.jsonl")}
    assert steps == {
        "steps.jsonl": [1, 2, 3],  # the ranks still there cut their own logs when they start
        "steps-rank1.jsonl": [1, 2, 3],
        "steps-rank2.jsonl": [1, 2],
        "steps-rank3.jsonl": [1, 2],
    }
