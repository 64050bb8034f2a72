"""The shared bottom-layer helpers: atomic writes, JSON output, text tables."""

from __future__ import annotations

import json
import os

import pytest

from gpufeed.core._files import atomic_path, temp_path, write_atomic, write_json
from gpufeed.core._text import format_table


def test_write_json_is_indented_or_compact(tmp_path):
    path = write_json(tmp_path / "a" / "doc.json", {"x": [1, 2]})
    assert path.read_text(encoding="utf-8") == '{\n  "x": [\n    1,\n    2\n  ]\n}\n'
    write_json(path, {"x": [1, 2]}, compact=True, atomic=True)
    assert path.read_text(encoding="utf-8") == '{"x":[1,2]}'
    for atomic in (False, True):
        with pytest.raises(ValueError):
            write_json(path, {"x": float("nan")}, allow_nan=False, atomic=atomic)
    assert json.loads(path.read_text(encoding="utf-8")) == {"x": [1, 2]}  # the old file is untouched
    assert sorted(p.name for p in path.parent.iterdir()) == ["doc.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = write_atomic(tmp_path / "f.txt", "old\n")
    with pytest.raises(RuntimeError), atomic_path(path, sync_dir=True) as tmp:
        assert tmp == temp_path(path) and tmp.name.startswith(".f.txt.tmp-")
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_format_table_aligns_numbers_right_and_text_left():
    text = format_table(["name", "n", "ms"], [["a", 1, 1234.56], ["bbb", 22, 0.5]])
    assert text == "name   n       ms\n----  --  -------\na      1  1,234.6\nbbb   22      0.5"


def test_a_plain_write_goes_through_a_symlink_and_an_atomic_one_replaces_it(tmp_path):
    target = tmp_path / "target.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_json(link, [1])
    assert link.is_symlink() and target.read_text() == "[\n  1\n]\n"
    write_json(link, [2], atomic=True)
    assert not link.is_symlink() and target.read_text() == "[\n  1\n]\n"


def test_a_killed_writers_temporary_file_is_removed_once_it_has_lain_idle(tmp_path):
    import time

    from gpufeed.core._files import _runs, remove_stale_temps, temp_path

    target = tmp_path / "video_predictions.csv"
    gone = next(pid for pid in range(4_000_000, 3_000_000, -997) if not _runs(pid))  # no such process
    dead = tmp_path / f".{target.name}.tmp-{gone}"  # its writer was killed
    alive = tmp_path / f".{target.name}.tmp-{os.getppid()}"  # a running process's write
    mine = temp_path(target)
    other = tmp_path / f".other.csv.tmp-{gone}"  # another target's
    for path in (dead, alive, mine, other):
        path.write_text("partial")
    assert remove_stale_temps(target) == []  # all fresh: a writer elsewhere may still be at it
    old = time.time() - 3600
    for path in (dead, alive, mine, other):
        os.utime(path, (old, old))
    assert remove_stale_temps(target) == [dead]
    assert not dead.exists() and alive.exists() and mine.exists() and other.exists()
