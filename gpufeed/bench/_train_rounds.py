"""How ``gpufeed bench train`` runs its rounds: both sides interleaved in chunks of steps, or one after the other.

On a shared machine the speed of a training step drifts by several times within a minute
(another job starts, the CPU's share halves). Timing one side's whole run, then the other's,
compares two different machines. With ``chunk_steps`` set, each round starts both sides (fresh
model and loader each, the model warmed up untimed: :func:`_warm_up`) and alternates between them
every ``chunk_steps`` steps, in the order A B B A A B ... so that a drift in time favours neither.
A chunk pair (the same steps of both sides, run back to back) saw nearly the same machine: its
samples/s ratio is one measurement, and the median over all pairs of all rounds is the figure that
a noisy machine moves least.

Only one side steps at a time; the other side's loader is idle. What it still does meanwhile is
finish the batches it had already started (DALI's queued iterations, the DataLoader workers'
outstanding indices): for a loader that keeps up with the step that is the one batch it starts
when the last batch of its chunk is taken, the same for both sides. A loader that does *not*
keep up would catch up while idle and start its next chunk with a full queue, hiding up to its
queue depth of waits per chunk; so interleaving is the default only where the step is
compute-bound by far (``--task depth`` on a CPU, see ``DEFAULTS`` in
:mod:`gpufeed.bench.train`), and ``chunk_steps`` of 0 runs each side's whole round in one piece
(each round then gives one pair).
"""

from __future__ import annotations

import gc
import time

import torch

from gpufeed.bench._train_report import SIDES
from gpufeed.pipelines import NEXT_PHASES
from gpufeed.train import Finished, StepTimeline

__all__ = ["WARMUP_STEPS", "run_rounds"]

# Untimed steps of each side's model before its first timed one: with CUDA graphs (train.compile
# reduce-overhead) torch runs a function's first call eagerly and records the second, and timed steps replay.
WARMUP_STEPS = 2


def _ids_on_the_way(batch, clips: bool) -> list:
    """The batch's ids, as lists on the CPU; on a GPU, copies to the host that do not wait.

    The copies are queued before the step, so they are complete once the step has been read.
    """
    fields = (batch.video_ids, batch.start_frames) if clips else (batch.sample_ids,)
    return [f.tolist() if f.device.type == "cpu" else f.to("cpu", non_blocking=True) for f in fields]


def _phase_sums(records: list[dict]) -> dict:
    """Seconds per phase of the loader calls behind one batch (normally one; none for a DataLoader)."""
    sums: dict[str, float] = {}
    for record in records:
        for phase, seconds in record.items():
            sums[phase] = sums.get(phase, 0.0) + seconds
    return sums


def _ids(fields: list, clips: bool) -> list:
    lists = [f if isinstance(f, list) else f.tolist() for f in fields]
    return list(zip(*lists, strict=True)) if clips else lists[0]


class _Side:
    """One side of one round: its stepper and feed, stepped a chunk at a time, timed as the trainer times."""

    def __init__(self, run, side: str, augment, round_index: int) -> None:
        self.run, self.side, self.round = run, side, round_index
        self.stepper = run.stepper(augment)
        _warm_up(run, self.stepper)
        self.feed = run.feed(side)  # a generator: the loader starts on the first next, inside the first wait
        # The trainer's timeline: steps queued one ahead on a GPU, periods that add up to the chunk's time.
        self.timeline: StepTimeline[tuple] = StepTimeline(launch_ahead=run.device.is_gpu)
        self.steps: list[dict] = []
        self.seen: list[list] = [[] for _ in range(run.epochs)]
        self.wall_s = 0.0  # time the steps partition, summed over chunks
        self.closing_s = 0.0  # time after a chunk's last step: the feed's end of iteration
        self.done = False

    def chunk(self, count: int, bar) -> tuple[int, float]:
        """Run up to ``count`` steps: (samples, seconds of step time); (0, 0.0) once the feed is done."""
        samples, step_total = 0, 0.0
        started_chunk = time.perf_counter()
        self.timeline.begin(started_chunk)
        for _ in range(count):
            started = time.perf_counter()
            try:
                epoch, index, batch = next(self.feed)
            except StopIteration:
                self.done = True
                break
            wait_s = time.perf_counter() - started
            phases = _phase_sums(NEXT_PHASES.take())  # gpufeed's loader: where that wait went
            ids = _ids_on_the_way(batch, self.run.clips)
            launched, launched_cpu = time.perf_counter(), time.thread_time()
            pending = self.stepper.launch(batch)
            # Host time queueing the step, as the trainer records it (a GPU only: the CPU runs it),
            # and of it the thread's CPU time: the rest it waited, for Python's lock say.
            timed = (time.perf_counter() - launched, time.thread_time() - launched_cpu)
            launch = timed if self.timeline.launch_ahead else None
            done = self.timeline.push(pending, (epoch, index, wait_s, launch, ids, phases))
            samples, step_total = self._keep(done, samples, step_total, bar)
        samples, step_total = self._keep(self.timeline.finish(), samples, step_total, bar)
        # The chunk trained until its last step's record ended; what follows is the exhausted feed
        # closing (a DataLoader joining its workers), which no step holds: counted apart.
        ended = time.perf_counter()
        self.wall_s += self.timeline.last_end - started_chunk
        self.closing_s += ended - self.timeline.last_end
        return samples, step_total

    def _keep(self, done: Finished[tuple] | None, samples: int, step_total: float, bar) -> tuple[int, float]:
        if done is None:
            return samples, step_total
        (epoch, index, wait_s, launch, ids, phases), outcome = done.info, done.outcome
        self.steps.append(
            {
                "round": self.round,
                "epoch": epoch,
                "batch": index,
                "loader_wait_s": wait_s,
                "augment_s": outcome.augment_s,
                "compute_s": outcome.compute_s,
                "step_s": done.step_s,
                "samples": outcome.samples,
                **({"launch_s": launch[0], "launch_cpu_s": launch[1]} if launch is not None else {}),
                **({"next_phases_s": phases} if phases else {}),
            }
        )
        self.seen[epoch].extend(_ids(ids, self.run.clips))
        bar.update(1)
        return samples + outcome.samples, step_total + done.step_s

    def block(self) -> dict:
        """What the report reads of this side's round; drops the loader and model."""
        self.feed.close()
        del self.feed, self.stepper
        return {
            "steps": self.steps,
            "wall_s": self.wall_s,
            "feed_closing_s": self.closing_s,
            "samples_per_epoch": [len(ids) for ids in self.seen],
            "ids": self.seen,
        }


def run_rounds(
    run, augmenters: dict, bar, chunk_steps: int
) -> tuple[dict[str, list[dict]], list[dict], list[list[str]]]:
    """Every round, ``run.sides`` interleaved by chunks of ``chunk_steps`` steps (0: each side's whole round).

    Returns:
        ``(blocks, pairs, orders)``: per side, one block per round (steps, wall time, samples per
        epoch, the ids seen); one entry per chunk pair (round, pair index, each side's samples/s,
        the gpufeed / DataLoader ratio); the side order of each round's first pair.
    """
    sides_run = run.sides  # both, or gpufeed's alone (no pairs then)
    blocks: dict[str, list[dict]] = {side: [] for side in sides_run}
    pairs: list[dict] = []
    orders: list[list[str]] = []
    chunk = chunk_steps if chunk_steps > 0 else run.epochs * run.steps_per_epoch + 1
    for r in range(run.rounds):
        sides = {side: _Side(run, side, augmenters[side], r) for side in sides_run}
        k = 0
        while not all(s.done for s in sides.values()):
            order = list(sides_run) if (r + k) % 2 == 0 else list(reversed(sides_run))
            if k == 0:
                orders.append(order)
            rates: dict[str, float] = {}  # the sides that ran samples in this pair
            for side in order:
                bar.set_description(f"round {r + 1}/{run.rounds} {side}")
                samples, seconds = sides[side].chunk(chunk, bar)
                if samples and seconds > 0:
                    rates[side] = samples / seconds
            if len(rates) == len(SIDES):  # a pair: both sides ran
                ratio = rates["gpufeed"] / rates["dataloader"]
                pairs.append({"round": r, "pair": k, **{f"{s}_samples_per_s": rates[s] for s in SIDES}, "ratio": ratio})
            k += 1
        for side in sides_run:
            blocks[side].append(sides[side].block())
        del sides
        gc.collect()  # loader workers and DALI pipelines go now, before the next round starts (and forks)
    return blocks, pairs, orders


def _warm_up(run, stepper) -> None:
    """Run ``WARMUP_STEPS`` untimed steps of ``stepper`` on random pixels, then collect and synchronise.

    The side's own stepper, not a separate one: besides compiling (once per process), autotuning and
    warming the allocator, its steps create its optimizer's state and, with CUDA graphs, record the
    graphs for its model's parameters. Graphs recorded for another model's parameters would be
    recorded again for this one's, which lie elsewhere, inside its first timed steps (and recording
    synchronises the device twice). The batch is drawn just after ``run.stepper`` seeded torch:
    the same pixels on both sides. The garbage of compiling is collected and the queued steps finish
    here, so that neither lands in a timed step.
    """
    batch = run.synthetic_batch()
    for _ in range(WARMUP_STEPS):
        stepper(batch)
    del batch
    gc.collect()
    if run.device.is_gpu:
        torch.cuda.synchronize(run.device.torch_device)
