"""Bad data end to end: ``gpufeed check`` finds it, training stops on it, skips it, or quarantines it.

``run_bad_data(out)`` (``gpufeed reliability bad-data``) copies the synthetic dataset and damages
it (:func:`write_bad_dataset`): in the training images a truncated JPEG, a zero-byte file, a
non-image with a ``.jpg`` name (all three visible to the index, before decoding) and a PNG whose
compressed pixel data is corrupt (header and end intact: only a full decode finds it); among the
videos one truncated mp4. Then, with real ``gpufeed`` commands run in this process:

==================  ==========================================================================
case                expected
==================  ==========================================================================
check               ``gpufeed check`` lists exactly the 5 damaged files, exit status 1,
                    ``--quarantine`` writes their paths
image, default      ``loader.on_bad_sample: error``: stops before the first step, naming the
                    three files the index sees
image, decode       the same with those three quarantined: stops at the batch holding the
                    corrupt PNG, naming it
image, skip         ``on_bad_sample: skip``: trains to the end; the summary line, a log
                    warning, ``summary.json`` and ``gpufeed_train_skipped_samples_total`` all
                    say 4 skipped
image, quarantine   ``loader.quarantine_file`` from check, default policy: trains to the end,
                    4 skipped (quarantined)
clip, default       stops before training, naming the truncated video
clip, skip          trains to the end, 1 video skipped
clip, quarantine    trains to the end with the default policy, 1 video skipped (quarantined)
==================  ==========================================================================
"""

from __future__ import annotations

import json
import shutil
import struct
import threading
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from gpufeed.core import Checklist, format_table, progress_bar
from gpufeed.pipelines import NOT_BAD
from gpufeed.reliability._common import (
    LogCapture,
    ensure_synth,
    run_cli,
    step_records,
    tiny_train_mapping,
    write_train_yaml,
)

__all__ = ["BadDataReport", "BadDataset", "CaseResult", "run_bad_data", "write_bad_dataset"]


@dataclass(frozen=True)
class BadDataset:
    """A damaged copy of the synthetic dataset.

    Attributes:
        root: Holds ``images/`` (lists ``train.txt``, ``val.txt``) and ``videos/``, as ``gpufeed synth`` does.
        damaged: Path -> what was done to it, for every damaged file.
        index_visible: The damaged images the index finds without decoding.
        decode_only: The damaged images only a full decode finds.
        videos: The damaged videos.
    """

    root: Path
    damaged: dict[str, str]
    index_visible: tuple[str, ...]
    decode_only: tuple[str, ...]
    videos: tuple[str, ...]


def write_bad_dataset(synth_dir: Path, out: Path) -> BadDataset:
    """Copy ``synth_dir`` (a ``gpufeed synth`` folder) to ``out`` and damage five files (see the module docs)."""
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    ignore = shutil.ignore_patterns(".gpufeed")
    shutil.copytree(Path(synth_dir) / "images", out / "images", ignore=ignore)
    shutil.copytree(Path(synth_dir) / "videos", out / "videos", ignore=ignore)
    train = out / "images" / "train"
    jpgs, pngs = sorted(train.rglob("*.jpg")), sorted(train.rglob("*.png"))
    damaged = {}
    jpgs[1].write_bytes(jpgs[1].read_bytes()[:-200])
    damaged[str(jpgs[1])] = "truncated JPEG (last 200 bytes cut)"
    jpgs[4].write_bytes(b"")
    damaged[str(jpgs[4])] = "zero-byte file"
    jpgs[7].write_text("this is not an image\n", encoding="utf-8")
    damaged[str(jpgs[7])] = "not an image (text named .jpg)"
    body = bytearray(pngs[2].read_bytes())
    at = body.index(b"IDAT")
    (length,) = struct.unpack(">I", body[at - 4 : at])
    body[at + 4 : at + 44] = bytes(b ^ 0x5A for b in body[at + 4 : at + 44])
    # A matching CRC keeps the structure whole: only decoding can find this one.
    body[at + 4 + length : at + 8 + length] = struct.pack(">I", zlib.crc32(bytes(body[at : at + 4 + length])))
    pngs[2].write_bytes(bytes(body))
    damaged[str(pngs[2])] = "corrupt PNG pixel data (header and IEND intact)"
    video = out / "videos" / "clip_000.mp4"
    video.write_bytes(video.read_bytes()[:-3000])
    damaged[str(video)] = "truncated mp4 (last 3000 bytes cut)"
    return BadDataset(
        root=out,
        damaged=damaged,
        index_visible=(str(jpgs[1]), str(jpgs[4]), str(jpgs[7])),
        decode_only=(str(pngs[2]),),
        videos=(str(video),),
    )


@dataclass
class CaseResult:
    """One training case: how it ended and what it reported.

    Attributes:
        name: The case, e.g. ``image, skip``.
        status: Exit status of ``gpufeed train`` (0 done, 2 stopped with an error).
        error: The error line, '' when it finished.
        named: The damaged files the error line names.
        steps: Steps logged before it finished or stopped.
        seconds: Wall time, start to end or to the error.
        skipped: Files the run reported skipped (summary.json), or ``None`` when it did not finish.
        quarantined: Of those, how many the quarantine list removed.
        summary_line: The ``skipped: ...`` line printed under the summary table.
        warned: Whether the log warned about the skipped files.
        metric: ``gpufeed_train_skipped_samples_total`` scraped from the run's /metrics at its end.
    """

    name: str
    status: int
    error: str = ""
    named: list[str] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    skipped: int | None = None
    quarantined: int | None = None
    summary_line: str = ""
    warned: bool = False
    metric: float | None = None


@dataclass
class BadDataReport(Checklist):
    """Everything :func:`run_bad_data` found (see the module docs for what is expected)."""

    dataset: BadDataset
    check_status: int
    check_listed: dict[str, str]
    quarantine_lines: list[str]
    cases: list[CaseResult]

    @property
    def damaged(self) -> dict[str, str]:
        return self.dataset.damaged

    def case(self, name: str) -> CaseResult:
        return next(c for c in self.cases if c.name == name)

    def checks(self) -> list[tuple[str, bool]]:
        """Each expectation of the module docs, and whether it held."""
        bad = self.dataset
        images = len(bad.index_visible) + len(bad.decode_only)
        out = [
            ("check exits 1", self.check_status == 1),
            ("check lists exactly the damaged files", sorted(self.check_listed) == sorted(bad.damaged)),
            ("--quarantine writes their paths", self.quarantine_lines == sorted(bad.damaged)),
        ]

        def stopped(name: str, named: tuple[str, ...], before_training: bool) -> None:
            c = self.case(name)
            out.append((f"{name}: exit 2 naming {len(named)} file(s)", c.status == 2 and c.named == sorted(named)))
            if before_training:
                out.append((f"{name}: stops before the first step", c.steps == 0))

        def finished(name: str, skipped: int, quarantined: int) -> None:
            c = self.case(name)
            out.append((f"{name}: trains to the end", c.status == 0 and c.steps > 0))
            out.append(
                (
                    f"{name}: summary.json, summary line, log and metric all say {skipped} skipped",
                    c.skipped == skipped
                    and c.quarantined == quarantined
                    and c.metric == skipped
                    and c.warned
                    and c.summary_line.startswith(f"skipped: {skipped} training"),
                )
            )

        stopped("image, default", bad.index_visible, before_training=True)
        stopped("image, decode", bad.decode_only, before_training=False)
        finished("image, skip", images, 0)
        finished("image, quarantine", images, images)
        stopped("clip, default", bad.videos, before_training=True)
        finished("clip, skip", len(bad.videos), 0)
        finished("clip, quarantine", len(bad.videos), len(bad.videos))
        return out

    def table(self) -> str:
        found = sum(p in self.check_listed for p in self.damaged)
        lines = [
            f"bad data: {len(self.damaged)} damaged files among the synthetic images and videos",
            f"gpufeed check: exit status {self.check_status}, listed {found} of {len(self.damaged)} damaged files "
            f"({len(self.check_listed)} listed in all); --quarantine wrote {len(self.quarantine_lines)} path(s)",
        ]
        rows = []
        for c in self.cases:
            if c.error:
                outcome = f"stopped: names {len(c.named)} file(s)"
            else:
                outcome = f"finished, skipped {c.skipped} ({c.quarantined} quarantined)"
            metric = "" if c.metric is None else f"{c.metric:g}"
            rows.append([c.name, c.status, outcome, c.steps, metric, f"{c.seconds:.1f}"])
        lines.append(format_table(["case", "exit", "outcome", "steps", "skipped metric", "seconds"], rows))
        lines += [f"{c.name}: {c.error or c.summary_line}" for c in self.cases]
        lines.append(self.verdict())
        return "\n".join(lines)


def _scrape_skipped_at_end(run_dir: Path, box: dict, stop: threading.Event) -> threading.Thread:
    """Scrape ``gpufeed_train_skipped_samples_total`` once the run writes summary.json (while it lingers).

    ``stop`` ends the watch when the run is over without a summary (it stopped with an error).
    """
    from prometheus_client.parser import text_string_to_metric_families

    def watch() -> None:
        while not (run_dir / "summary.json").exists():
            if stop.wait(0.02):
                return
        try:
            address = (run_dir / "metrics-rank0.addr").read_text(encoding="utf-8").strip()
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                text = response.read().decode()
        except OSError as err:
            box["error"] = str(err)
            return
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "gpufeed_train_skipped_samples_total":
                    box["value"] = sample.value

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _train_case(name: str, config: Path, run_dir: Path, overrides: list[str], damaged: dict) -> CaseResult:
    shutil.rmtree(run_dir, ignore_errors=True)
    args = ["train", "--config", str(config), "--out", str(run_dir)]
    for item in [*overrides, "telemetry.linger_seconds=1.5"]:
        args += ["--set", item]
    box: dict = {}
    stop = threading.Event()
    watcher = _scrape_skipped_at_end(run_dir, box, stop)
    with LogCapture() as logs:
        outcome = run_cli(*args)
    stop.set()
    watcher.join(timeout=30)
    result = CaseResult(name, outcome.status, error=outcome.error, seconds=outcome.seconds)
    result.named = sorted(p for p in damaged if p in outcome.error)
    result.steps = len(step_records(run_dir))
    summary = run_dir / "summary.json"
    if outcome.status == 0 and summary.is_file():
        skipped = json.loads(summary.read_text(encoding="utf-8"))["skipped"]["train"]
        result.skipped, result.quarantined = skipped["count"], skipped["quarantined"]
        result.summary_line = next((ln for ln in outcome.stdout.splitlines() if ln.startswith("skipped: ")), "")
        result.warned = any("skipped" in m and "cannot be used" in m for m in logs.messages)
        result.metric = box.get("value")
    return result


def run_bad_data(out: str | Path, *, data: str | Path | None = None, progress: bool = True) -> BadDataReport:
    """Run every case of the module docs in ``out`` (replacing an earlier run); return the figures.

    Args:
        out: Work folder: ``data/`` (unless ``data`` is given), ``bad/`` (the damaged copy), ``runs/``.
        data: An existing ``gpufeed synth`` folder to copy.
        progress: Show a progress bar over the cases.
    """

    out = Path(out)
    bad = write_bad_dataset(ensure_synth(Path(data) if data else out / "data"), out / "bad")
    runs = out / "runs"
    quarantine, partial = out / "quarantine.txt", out / "quarantine-index-visible.txt"
    check = run_cli("check", str(bad.root), "--quarantine", str(quarantine), "--json", str(out / "check.json"))
    findings = json.loads((out / "check.json").read_text(encoding="utf-8"))["findings"]
    listed = {f["path"]: f["reason"] for f in findings if f["kind"] not in NOT_BAD}  # not warnings or notes
    lines = quarantine.read_text(encoding="utf-8").splitlines() if quarantine.is_file() else []
    # Everything but the decode-only damage: training then starts and meets the corrupt PNG mid-epoch.
    partial.write_text("".join(p + "\n" for p in lines if p not in bad.decode_only), encoding="utf-8")

    mapping = tiny_train_mapping(bad.root, epochs=2, checkpoint_every_steps=0)
    # partial: every sample is read every epoch, so the decode-only file is met whatever the order.
    mapping["loader"]["last_batch"] = "partial"
    config = write_train_yaml(out / "train.yaml", mapping)
    clip_set = [
        "model.name=clip_resnet18",
        f"video.train={bad.root / 'videos'}",
        "video.size_px=32",
        "loader.batch_size=8",
        "train.epochs=1",
        "augment.ops=[]",
    ]
    cases = [
        ("image, default", []),
        ("image, decode", [f"loader.quarantine_file={partial}"]),
        ("image, skip", ["loader.on_bad_sample=skip"]),
        ("image, quarantine", [f"loader.quarantine_file={quarantine}"]),
        ("clip, default", clip_set),
        ("clip, skip", [*clip_set, "loader.on_bad_sample=skip"]),
        ("clip, quarantine", [*clip_set, f"loader.quarantine_file={quarantine}"]),
    ]
    results = []
    for name, overrides in progress_bar(cases, desc="bad data", unit="case", disable=not progress, leave=True):
        run_dir = runs / name.replace(", ", "-")
        results.append(_train_case(name, config, run_dir, overrides, bad.damaged))
    return BadDataReport(bad, check.status, listed, lines, results)
