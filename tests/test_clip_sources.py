"""Clip sources and frame store kinds: one class each, picked by one factory or registry, then asked.

The structural test reads the code with ``ast``: no decode source (``dali``, ``pyav``,
``pyav_sequential``, ``frames``) or frame store kind (``folder``, ``hdf5``, ``shard``) is compared as a string
outside the factory that picks a source (the count is printed; the factory functions are listed
with their reason). The others check what the factory picks from the videos' facts, the row order
each source owns, that a plan's clips are drawn once per batch and shared by everything that feeds
or reads the pipeline, and that a new storage kind is one class (a tar file of numbered frames,
WebDataset's layout) which the index, the sequential reader, ``check`` and ``prepare`` then take.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from _sources import parsed_file

from gpufeed.pipelines import _clip_sources
from gpufeed.pipelines._clip_plan import ClipDraw, ClipPlan, PlanRows
from gpufeed.pipelines._clip_sources import PyAVSource, ReaderSource, choose_clip_source
from gpufeed.pipelines._clips import ClipGeometry, ClipTable
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._store_sources import ScaledJpegSource, StoreSource
from gpufeed.pipelines._videos import VideoInfo

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("gpufeed", "pipelines", "models", "server")
NAMES = {"dali", "pyav", "pyav_sequential", "frames", "folder", "hdf5", "shard"}

# (file, function) -> why it may compare those names: the factory that turns facts into a source.
SOURCE_SWITCH_EXCEPTIONS = {
    ("pipelines/_clip_sources.py", "choose_clip_source"): (
        "the factory itself: video.decoder: dali asked of a folder mixing videos and frame stores is refused there"
    ),
    ("pipelines/_nvdec.py", "choose_decoder"): (
        "the factory's half for encoded videos: video.decoder's values (auto, dali, pyav) are the names it "
        "picks between; choose_clip_source turns its answer into the source class"
    ),
}


def _is_name(node: ast.AST) -> bool:
    """A source or kind name, or a literal collection holding one."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value in NAMES for e in node.elts)
    return False


def _store_video(sides: list[ast.AST]) -> bool:
    """``options.store == "video"``: prepare's ``store`` option compared with its no-store value."""
    text = any(isinstance(s, ast.Constant) and s.value == "video" for s in sides)
    return text and any("store" in ast.unparse(s).lower() for s in sides if not isinstance(s, ast.Constant))


def source_switches(source: str, tree: ast.AST | None = None) -> list[tuple[int, str, str]]:
    """(line, enclosing function, code) of every place a module switches on a source or store kind name.

    ``tree`` is ``source`` parsed, when the caller has it already.

    A comparison with one of the names (``source == "dali"``, ``kind in ("folder", "hdf5")``), a
    ``match`` with a case of one, a table keyed by two or more of them, or a ``store`` option
    compared with ``"video"``.
    """
    tree = tree if tree is not None else ast.parse(source)
    owner: dict[ast.AST, str] = {}
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                owner[node] = func.name  # walked outer first: the innermost function wins
    found = []
    for node in ast.walk(tree):
        code = None
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_name(s) for s in sides) or _store_video(sides):
                code = ast.unparse(node)
        elif isinstance(node, ast.match_case) and any(_is_name(n) for n in ast.walk(node.pattern)):
            code = f"case {ast.unparse(node.pattern)}"
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if len(keys & NAMES) >= 2:
                code = f"a table keyed by {sorted(keys & NAMES)}"
        if code:
            found.append((getattr(node, "lineno", 0), owner.get(node, ""), code))
    return sorted(found)


def test_no_source_or_store_kind_is_switched_on_by_name_outside_the_factory():
    outside, excepted = [], {key: 0 for key in SOURCE_SWITCH_EXCEPTIONS}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, function, code in source_switches(path.read_text(), parsed_file(path)):
                if (rel, function) in SOURCE_SWITCH_EXCEPTIONS:
                    excepted[(rel, function)] += 1
                else:
                    outside.append(f"  {rel}:{line} ({function or 'module'}): {code}")
    print(f"decode source / store kind string comparisons outside the factory: {len(outside)}")
    for (file, function), why in SOURCE_SWITCH_EXCEPTIONS.items():
        print(f"  exception {file} {function}() ({excepted[(file, function)]}): {why}")
    assert not outside, "a source or store kind compared by name outside the factory:\n" + "\n".join(outside)
    stale = [key for key, count in excepted.items() if not count]
    assert not stale, f"exceptions that compare no name any more, to remove from the list: {stale}"


@pytest.mark.parametrize(
    "source",
    [
        'if self.source == "dali": pass',
        'x = loader.source != "pyav"',
        'ok = source in ("dali", "frames")',
        'y = info.store == "hdf5"',
        'z = {"folder": 1, "hdf5": 2}[kind]',
        'if options.store == "video": pass',
        'match kind:\n    case "folder":\n        pass',
    ],
)
def test_the_counter_sees_each_form_of_switch(source):
    assert len(source_switches(source)) == 1, source


def test_the_counter_leaves_other_strings_alone():
    assert source_switches('a = out["frames"]; b = {"file_list_format": "frames"}; c = fit == "stretch"') == []


def _info(path, codec, store="", pix_fmt="yuv420p", profile="High"):
    return VideoInfo(
        path=path, codec=codec, width=64, height=48, num_frames=30, pix_fmt=pix_fmt, profile=profile, store=store
    )


def test_the_factory_picks_the_source_from_the_videos_facts(monkeypatch):
    monkeypatch.setattr(_clip_sources, "nvdec_library_problem", lambda: None)  # as on a GPU machine
    h264, vp9 = _info("a.mp4", "h264"), _info("b.webm", "vp9")
    jpeg, png = _info("c", "jpeg", store="folder"), _info("d.h5", "png", store="hdf5")
    cases = [
        (("auto", False, [vp9]), {}, ReaderSource, False),
        (("auto", False, [h264]), {}, PyAVSource, False),
        (("auto", True, [h264], "x", (9, 0)), {}, ReaderSource, False),
        (("auto", True, [_info("e.mp4", "h264", profile="High 10")], "x", (9, 0)), {}, PyAVSource, True),
        (("pyav", True, [h264], "x", (9, 0)), {}, PyAVSource, False),
        (("auto", True, [h264, png], "x", (9, 0)), {}, PyAVSource, True),
        (("auto", False, [jpeg]), {}, ScaledJpegSource, False),
        (("auto", False, [jpeg]), {"whole_clips": False}, StoreSource, False),
        (("auto", True, [jpeg, png], "x", (9, 0)), {}, StoreSource, False),
        (("auto", False, [jpeg, png]), {}, StoreSource, False),
    ]
    for args, kw, kind, fell_back in cases:
        if len(args) == 3:
            args = (*args, "x")
        source = choose_clip_source(*args, **kw)
        assert type(source) is kind and source.fell_back is fell_back, (args, kw, source)
    assert choose_clip_source("auto", True, [jpeg, png], "x").reason == (
        "HDF5 files and frame folders: one image decode per frame with nvJPEG / the hardware JPEG decoder"
    )
    with pytest.raises(DatasetError, match="dali cannot read x: it mixes encoded videos and frame stores"):
        choose_clip_source("dali", True, [h264, png], "x")


def test_a_gpu_whose_nvdec_library_does_not_load_decodes_with_pyav_or_refuses_dali_in_one_line():
    """A container without the driver's video capability: DALI's reader failed at its first batch, mid-run."""
    h264 = _info("a.mp4", "h264")
    missing = _clip_sources.nvdec_library_problem()  # this machine's answer: no driver here, so no NVDEC library
    source = choose_clip_source("auto", True, [h264], "x", (9, 0))
    if missing is None:
        assert type(source) is ReaderSource
        return
    assert "libnvcuvid.so.1" in missing and "NVIDIA_DRIVER_CAPABILITIES=compute,video,utility" in missing
    assert type(source) is PyAVSource and source.fell_back and missing in source.reason
    with pytest.raises(DatasetError, match=r"^video\.decoder: dali cannot read x: NVDEC's driver library"):
        choose_clip_source("dali", True, [h264], "x", (9, 0))
    assert type(choose_clip_source("auto", False, [_info("b.webm", "vp9")], "x")) is ReaderSource  # no GPU: not asked


def test_each_source_owns_its_row_order():
    """DALI's reader by (video, start) over the filled rows, PyAV by (video, start) with the filling last, stores as planned."""
    rows = PlanRows(3, 0, np.array([2, 0, 2, 1, 1]), np.array([50, 90, 10, 7, 7]), count=4)
    assert rows.first_tag == 15 and [a.tolist() for a in rows.clips()] == [[2, 0, 2, 1], [50, 90, 10, 7]]
    assert ReaderSource("").read_order(rows).tolist() == [1, 3, 4, 2, 0]
    assert PyAVSource("").read_order(rows).tolist() == [1, 3, 2, 0, 4]
    assert StoreSource("").read_order(rows).tolist() == [0, 1, 2, 3, 4]
    assert StoreSource("").row_order(None) is None and ScaledJpegSource("").row_order(None) is None
    assert StoreSource.frames_flat and not ScaledJpegSource.frames_flat and not ReaderSource.frames_flat
    assert not PyAVSource.full_ranges and ReaderSource.full_ranges and StoreSource.full_ranges


class _Stream:
    """A plan stream of fixed batches (iteration k: slots 2k, 2k + 1, or slot 2k alone at the end)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots

    def __getitem__(self, k: int):
        from types import SimpleNamespace

        ids = np.arange(2 * k, min(2 * k + 2, self.slots))
        return SimpleNamespace(sample_ids=ids, epoch=0)


@dataclass(frozen=True)
class _CountingDraw(ClipDraw):
    draws: list = field(default_factory=list, compare=False)

    def clips(self, slots, epoch):
        self.draws.append(tuple(slots))
        return super().clips(slots, epoch)


def test_a_plans_rows_are_drawn_once_per_batch_filled_and_picklable():
    import pickle

    geometry = ClipGeometry(4, 1)
    table = ClipTable.build(np.array([20, 8]), np.array([0, 1]), geometry)
    draws: list[tuple] = []
    plan = ClipPlan(_Stream(len(table)), _CountingDraw(table, train=True, seed=3, draws=draws), batch_size=2)
    last = (len(table) - 1) // 2
    for _ in range(3):
        for k in range(last + 1):
            assert plan[k] is plan[k]
    assert len(draws) == last + 1, "each batch drawn once"
    end = plan[last]
    assert end.count == 1 and end.videos[1] == end.videos[0] and end.starts[1] == end.starts[0], "filled with the last"
    copy = pickle.loads(pickle.dumps(plan))
    assert not copy._rows and [a.tolist() for a in copy(0)] == [a.tolist() for a in plan(0)]


@pytest.fixture(scope="module")
def vp9_dir(synth_dir, tmp_path_factory):
    """The synth videos as VP9, which DALI's CPU reader decodes in this process (no worker process)."""
    from gpufeed.pipelines import PrepareOptions, prepare_videos

    out = tmp_path_factory.mktemp("vp9") / "videos"
    report = prepare_videos(synth_dir / "videos", out, PrepareOptions(codec="vp9", gop_frames=30, probe_clips=0), False)
    assert report.ok, report.table()
    return out


def test_the_loader_draws_each_batchs_clips_once_for_the_list_the_crop_windows_the_augment_and_the_batch(
    vp9_dir, monkeypatch
):
    """DALI's reader, centre crop and flips: four users of every batch's rows, one draw of them."""
    from gpufeed.config import LoaderConfig, VideoConfig
    from gpufeed.device import DeviceChoice
    from gpufeed.pipelines import ClipLoader, LoaderAugment, VideoDataset

    draws: list[tuple[int, tuple[int, ...]]] = []
    original = ClipTable.clips

    def counted(self, slots, *, train, seed, epoch):
        draws.append((epoch, tuple(np.asarray(slots).tolist())))
        return original(self, slots, train=train, seed=seed, epoch=epoch)

    loader = ClipLoader(
        VideoDataset.from_folder(vp9_dir),
        train=True,
        video_cfg=VideoConfig(clip_length_frames=5, size_px=[32, 24], fit="centre_crop", decoder="dali"),
        loader_cfg=LoaderConfig(batch_size=4, num_threads=1, last_batch="partial"),
        device=DeviceChoice("cpu", None, "test"),
        augment=LoaderAugment(flip_p=0.5),
        seed=2,
    )
    assert type(loader.clip_source) is ReaderSource and loader.source == "dali"
    monkeypatch.setattr(ClipTable, "clips", counted)
    batches = [(b.video_ids.tolist(), b.start_frames.tolist()) for b in loader]
    assert len(batches) == len(loader) >= 3
    assert len(draws) == len(set(draws)) >= len(batches), "no batch's clips drawn twice"
    assert loader.pipeline_builds == 1 and len(loader.reader_builds) == 1
    loader.close()
    assert not loader.clip_source._resources, "closing the loader removed the reader's file list"
