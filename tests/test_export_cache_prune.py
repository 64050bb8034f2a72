"""The export cache of ``gpufeed predict`` is bounded: least recently used exports go first, never the new one.

Real checkpoints and real exports (``gpufeed export``'s own, about 14.5 MB each for this small clip
model): a load from the cache refreshes an entry's last use, an export past the limit removes the
least recently used others (one log line each), an entry another loader holds is kept, and nothing
gpufeed did not write is removed. ``gpufeed cache list|prune|clear`` and ``predict
--export-cache-max-mb`` run end to end, in this process; one test (``process``) holds an entry from
a second process.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _serving import write_checkpoint
from predicthelp import CPU
from videohelp import encode_tagged_video

from gpufeed.cli import build_parser, main
from gpufeed.models import ONNX_FILE
from gpufeed.predict import ExportCacheEntry, list_export_cache, load_predictor, prune_export_cache
from gpufeed.predict._cache_entries import ENV_EXPORT_CACHE_MAX_MB, USE_FILE, export_cache_max_bytes
from gpufeed.predict._export_cache import KEY_FILE, cached_export, held_export

pytestmark = pytest.mark.timeout(600)

SPEC = {"num_classes": 3, "size_px": 32, "clip_length_frames": 4}
REMOVED = re.compile(
    r"export cache over its (\S+) MB limit: removed ([0-9a-f]{32}) \((\d+\.\d) MB, last used "
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, (.+)\)$"
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Three checkpoints of one clip model (different weights) and a short video."""
    root = tmp_path_factory.mktemp("prune")
    found = {name: write_checkpoint(root / f"run-{name}", "r3d_small", seed=i, **SPEC) for i, name in enumerate("abc")}
    found["video"] = root / "videos" / "mouse.mp4"
    encode_tagged_video(found["video"], 1, 30, width=64, height=48, labels=False)
    return found


def _names(cache: Path) -> set[str]:
    return {e.name for e in list_export_cache(cache).entries}


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpufeed.predict" and r.levelno >= logging.WARNING]


def _removals(caplog) -> list[tuple[str, str]]:
    """(entry name, checkpoint) of each removal line logged."""
    found = [REMOVED.search(r.getMessage()) for r in caplog.records]
    return [(m[2], m[4]) for m in found if m]


def test_the_least_recently_used_go_first_and_the_new_export_stays(checkpoints, tmp_path, caplog):
    cache = tmp_path / "cache"
    a = cached_export(checkpoints["a"], 1, cache)
    b = cached_export(checkpoints["b"], 1, cache)
    size = list_export_cache(cache).entries[0].size_bytes
    assert size > 1_000_000 and a.export_s > 0 and b.export_s > 0
    again = cached_export(checkpoints["a"], 1, cache)  # used again: b is now the least recently used
    assert again.export_s == 0.0 and again.folder == a.folder
    used = json.loads((a.folder / USE_FILE).read_text())
    assert (
        used["checkpoint"] == str(checkpoints["a"])
        and used["unix_s"] > json.loads((b.folder / USE_FILE).read_text())["unix_s"]
    )
    assert [e.name for e in list_export_cache(cache).entries] == [b.folder.name, a.folder.name]

    # Room for two and a half: the new export pushes out b alone, with one line naming it.
    caplog.set_level(logging.INFO, "gpufeed.predict")
    c = load_predictor(checkpoints["c"], CPU, batch_size=1, export_cache=cache, export_cache_max_mb=2.5 * size / 1e6)
    assert c.runtime == "onnx" and c.export.export_s > 0
    assert _names(cache) == {a.folder.name, c.export.folder.name} and not b.folder.exists()
    assert _removals(caplog) == [(b.folder.name, str(checkpoints["b"]))]
    assert not [p for p in cache.iterdir() if p.name.startswith(".")], "nothing left aside"

    # A limit below one export: every other entry goes, the new one stays though alone over it.
    caplog.clear()
    with held_export(checkpoints["a"], 2, cache, max_bytes=0) as fresh:
        assert fresh.export_s > 0 and fresh.card.batch_sizes == (1, 2)
    (left,) = list_export_cache(cache).entries
    assert left.folder == fresh.folder and left.size_bytes > 0
    assert sorted(n for n, _ in _removals(caplog)) == sorted([a.folder.name, c.export.folder.name])
    # And under no limit nothing is removed.
    cached_export(checkpoints["b"], 1, cache)
    with held_export(checkpoints["c"], 1, cache, max_bytes=math.inf):
        pass
    assert len(_names(cache)) == 3


def test_an_export_another_process_is_loading_is_kept(checkpoints, tmp_path, caplog):
    cache = tmp_path / "cache"
    a = cached_export(checkpoints["a"], 1, cache)
    b = cached_export(checkpoints["b"], 1, cache)
    # A live process's half-built export: hidden, uncounted, untouched; and a removal whose process died.
    building = cache / f".{b.folder.name}.tmp-{os.getpid()}"
    shutil.copytree(b.folder, building)
    abandoned = cache / f".{a.folder.name}.removing-999999"
    shutil.copytree(a.folder, abandoned)
    caplog.set_level(logging.INFO, "gpufeed.predict")
    # The lock a loader holds from finding an entry until its sessions are made (held_export, as
    # load_predictor holds it): a pruner meanwhile skips that entry, whichever is least recently used.
    with held_export(checkpoints["a"], 1, cache) as loading:
        assert loading.folder == a.folder and loading.export_s == 0.0
        done = prune_export_cache(cache, 0)
        assert [e.name for e in done.in_use] == [a.folder.name]
        assert [e.name for e in done.removed] == [b.folder.name] and not done.failed
        assert (loading.folder / ONNX_FILE).is_file()
        assert done.left_bytes == list_export_cache(cache).total_bytes > 0
    assert f"kept {a.folder.name}, in use by another process" in caplog.text
    assert building.is_dir() and (building / KEY_FILE).is_file(), "a live build is not touched"
    assert not abandoned.exists(), "a dead process's removal is finished"
    # Released: now it goes.
    done = prune_export_cache(cache, 0)
    assert [e.name for e in done.removed] == [a.folder.name] and not done.in_use and done.left_bytes == 0
    assert _names(cache) == set() and building.is_dir()


def test_nothing_gpufeed_did_not_write_is_removed(checkpoints, tmp_path, caplog):
    cache = tmp_path / "cache"
    a = cached_export(checkpoints["a"], 1, cache)
    b = cached_export(checkpoints["b"], 1, cache)
    (cache / "notes.txt").write_text("the lab's notes")
    (cache / "datasets").mkdir()
    (cache / "datasets" / "big.bin").write_bytes(b"\0" * 2_000_000)
    unkeyed = cache / ("0" * 32)
    shutil.copytree(b.folder, unkeyed)
    (unkeyed / KEY_FILE).unlink()
    renamed = cache / ("f" * 32)  # a copy under another name: its key does not give that name
    shutil.copytree(b.folder, renamed)
    (cache / "link").symlink_to(a.folder, target_is_directory=True)
    # A damaged entry is still gpufeed's: a truncated graph, a garbled record of its last use.
    graph = b.folder / ONNX_FILE
    graph.write_bytes(graph.read_bytes()[:1000])
    (b.folder / USE_FILE).write_text("{")
    listing = list_export_cache(cache)
    assert sorted(e.name for e in listing.entries) == sorted([a.folder.name, b.folder.name])
    damaged = next(e for e in listing.entries if e.name == b.folder.name)
    assert damaged.checkpoint is None and damaged.last_used_unix_s == (b.folder / KEY_FILE).stat().st_mtime
    others = {p.name: why for p, why in listing.others}
    assert others == {
        "0" * 32: f"its {KEY_FILE} is unreadable (FileNotFoundError)",
        "datasets": "not named as an export",
        "f" * 32: f"its {KEY_FILE} is not the key its name was made from",
        "link": "not a folder",
        "notes.txt": "not a folder",
    }
    caplog.set_level(logging.INFO, "gpufeed.predict")
    with held_export(checkpoints["c"], 1, cache, max_bytes=0) as fresh:
        pass
    assert _names(cache) == {fresh.folder.name}
    assert sorted(n for n, _ in _removals(caplog)) == sorted([a.folder.name, b.folder.name])
    assert "5 item(s) gpufeed did not write left alone (0000" in caplog.text
    assert (cache / "notes.txt").read_text() == "the lab's notes" and (cache / "datasets" / "big.bin").is_file()
    assert (unkeyed / ONNX_FILE).is_file() and (renamed / KEY_FILE).is_file() and (cache / "link").is_symlink()


def test_a_cache_that_cannot_be_written_and_a_bad_limit_are_one_line_each(checkpoints, tmp_path, caplog, monkeypatch):
    cache = tmp_path / "cache"
    a = cached_export(checkpoints["a"], 1, cache)
    (a.folder / USE_FILE).unlink()
    (a.folder / USE_FILE).mkdir()  # its last use cannot be written (as on a read-only cache, even as root)
    caplog.set_level(logging.WARNING, "gpufeed.predict")
    predictor = load_predictor(checkpoints["a"], CPU, batch_size=1, export_cache=cache)
    assert predictor.runtime == "onnx" and predictor.export.folder == a.folder and predictor.export.export_s == 0.0
    (line,) = _warnings(caplog)
    assert line.startswith(f"predict: cannot record the use of the cached export {a.folder} (")
    assert list_export_cache(cache).entries[0].checkpoint is None, "its time falls back to its key file's"

    caplog.clear()
    monkeypatch.setenv(ENV_EXPORT_CACHE_MAX_MB, "lots")
    assert export_cache_max_bytes() == 2048e6
    assert _warnings(caplog) == [
        f"predict: ${ENV_EXPORT_CACHE_MAX_MB}: 'lots' is not a size limit; allowed: a number of MB >= 0, or none "
        "(no limit); using 2048 MB"
    ]
    for text, expected in (("none", math.inf), ("0", 0.0), ("1.5", 1.5e6)):
        monkeypatch.setenv(ENV_EXPORT_CACHE_MAX_MB, text)
        assert export_cache_max_bytes() == expected
    assert export_cache_max_bytes(3) == 3e6


def test_the_cache_command_and_the_predict_flag_end_to_end(checkpoints, tmp_path, capsys):
    cache = tmp_path / "cache"
    a = cached_export(checkpoints["a"], 1, cache)
    b = cached_export(checkpoints["b"], 1, cache)
    (cache / "notes.txt").write_text("keep me")
    entries: list[ExportCacheEntry] = list_export_cache(cache).entries
    capsys.readouterr()  # the exports' parity lines
    assert main(["cache", "list", "--dir", str(cache)]) == 0
    out = capsys.readouterr().out
    total_mb = sum(e.size_bytes for e in entries) / 1e6
    assert out.startswith(f"export cache {cache}: 2 export(s), {total_mb:,.1f} MB (limit 2,048 MB")
    lines = out.splitlines()
    rows = [line for line in lines if line.startswith((a.folder.name, b.folder.name))]
    assert [r.split()[0] for r in rows] == [a.folder.name, b.folder.name], "least recently used first"
    assert rows[0].endswith(str(checkpoints["a"])) and f"{entries[0].size_bytes / 1e6:,.1f}" in rows[0]
    assert lines[-1] == "not a gpufeed export, left alone: notes.txt (not a folder)"

    # prune to room for one and a half: the least recently used (a) goes.
    limit_mb = 1.5 * entries[0].size_bytes / 1e6
    assert main(["cache", "prune", "--dir", str(cache), "--max-mb", f"{limit_mb}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpufeed cache prune: removed 1 export(s), ")
    assert _names(cache) == {b.folder.name}

    # predict with a limit of 0: its new export stays, b goes, the scores are written.
    code = main(["predict", str(checkpoints["c"]), str(checkpoints["video"]), "--out", str(tmp_path / "out"),
                 "--export-cache", str(cache), "--export-cache-max-mb", "0", "--batch-size", "1", "--quiet"])  # fmt: skip
    assert code == 0 and (tmp_path / "out" / "mouse_predictions.csv").is_file()
    assert "predict: 1 scored, 0 kept" in capsys.readouterr().out
    (left,) = list_export_cache(cache).entries
    assert left.checkpoint == str(checkpoints["c"]) and not b.folder.exists()

    assert main(["cache", "clear", "--dir", str(cache)]) == 0
    assert capsys.readouterr().out.startswith("gpufeed cache clear: removed 1 export(s), ")
    assert _names(cache) == set() and (cache / "notes.txt").read_text() == "keep me"

    # The limits' spelling, on the command line.
    assert build_parser().parse_args(["predict", "m", "v", "--export-cache-max-mb", "none"]).export_cache_max_mb == (
        math.inf
    )
    assert build_parser().parse_args(["cache", "prune", "--max-mb", "512"]).max_mb == 512.0
    # The folder under predict's name for it too.
    assert build_parser().parse_args(["cache", "list", "--export-cache", "x"]).dir == Path("x")
    for bad in ("-1", "lots", "inf"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["cache", "prune", "--max-mb", bad])
        assert f"argument --max-mb: {bad!r} is not a size limit; allowed: a number of MB >= 0, or none" in (
            capsys.readouterr().err
        )


HOLDER = """
import sys, time
from pathlib import Path
from gpufeed.predict._export_cache import held_export
checkpoint, cache, ready, release = sys.argv[1:]
with held_export(checkpoint, 1, cache) as export:
    Path(ready).write_text(f"{export.folder} {export.export_s}")
    deadline = time.monotonic() + 120
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


@pytest.mark.process
def test_an_export_held_by_another_process_is_kept_until_it_lets_go(checkpoints, tmp_path):
    """Two processes sharing a cache: one holds an entry as ``predict`` does while it loads; the other prunes."""
    cache = tmp_path / "cache"
    a = cached_export(checkpoints["a"], 1, cache)
    b = cached_export(checkpoints["b"], 1, cache)
    ready, release = tmp_path / "ready", tmp_path / "release"
    args = [sys.executable, "-c", HOLDER, str(checkpoints["a"]), str(cache), str(ready), str(release)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as holder:
        try:
            deadline = time.monotonic() + 120
            while not ready.exists() and holder.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert ready.exists(), (
                f"the holder did not start: {holder.stdout.read() if holder.poll() is not None else ''}"
            )
            assert ready.read_text() == f"{a.folder} 0.0", "it found a's export in the cache"
            # a is the least recently used no more (the holder just used it); a limit of 0 takes both if it can.
            done = prune_export_cache(cache, 0)
            assert [e.name for e in done.in_use] == [a.folder.name] and [e.name for e in done.removed] == [
                b.folder.name
            ]
            assert (a.folder / ONNX_FILE).is_file()
        finally:
            release.write_text("")
            output, _ = holder.communicate(timeout=60)
    assert holder.returncode == 0, output
    done = prune_export_cache(cache, 0)
    assert [e.name for e in done.removed] == [a.folder.name] and _names(cache) == set()
