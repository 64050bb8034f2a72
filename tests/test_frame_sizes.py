"""A frame of another size inside a frame store: found by ``check`` from its header, named by the loaders.

Before, such a store passed ``check`` and training stopped with DALI's ``fn.stack`` traceback ("not
bad data"), which ``loader.on_bad_sample: skip`` could not help. Every way a store's frames are
decoded is covered: DALI's image decoder (PNG stores on a CPU, every store on a GPU: the failure
is re-checked outside DALI), the DCT-scaled JPEG decode of DALI's worker processes, and the PyAV
workers of a set that mixes stores with video files.
"""

from __future__ import annotations

import io
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from videohelp import write_tagged_store

from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import BadSampleError, ClipLoader, VideoDataset, check_path
from gpufeed.pipelines._pyav import ClipDecodeError, ClipDecoder, VideoRef
from gpufeed.pipelines._store_feed import ScaledJpegClips, StoreRef

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
FRAMES = 24
BAD = 13  # the frame replaced by one of another size
MESSAGE = "{where} is 80x40 but frame 0 is 96x64: every frame of a store must have one size"


def _odd_frame(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (80, 40), (200, 10, 10)).save(out, format=fmt)
    return out.getvalue()


def _store(root, form: str):
    """A tagged 96x64 store (``folder``/``folder_jpg``/``hdf5``/``hdf5_jpg``) whose frame 13 is 80x40."""
    jpg = form.endswith("_jpg")
    ext = ".jpg" if jpg else ".png"
    if form.startswith("hdf5"):
        path = root / form / "mouse.h5"
        write_tagged_store(path, 0, FRAMES, ext=ext, by="hand")
        import h5py

        with h5py.File(path, "a") as fh:
            fh["frame"][BAD] = np.frombuffer(_odd_frame("JPEG" if jpg else "PNG"), dtype=np.uint8)
        return path, f"frame {BAD}"
    path = root / form / "mouse"
    write_tagged_store(path, 0, FRAMES, ext=ext, by="hand")
    name = f"{BAD:09d}{ext}"
    (path / name).write_bytes(_odd_frame("JPEG" if jpg else "PNG"))
    return path, name


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("sizes")
    return {form: _store(root, form) for form in ("folder", "folder_jpg", "hdf5", "hdf5_jpg")}


def _loader(dataset, device=CPU, **kw):
    return ClipLoader(
        dataset,
        train=False,  # evaluation reads every slot, so it meets frame 13
        video_cfg=VideoConfig(clip_length_frames=5, size_px=[48, 32]),
        loader_cfg=LoaderConfig(batch_size=2, num_threads=2, last_batch="partial", **kw),
        device=device,
        seed=0,
        shard_id=0,
        num_shards=1,
    )


@pytest.mark.parametrize("form", ["folder", "folder_jpg", "hdf5", "hdf5_jpg"])
def test_check_names_the_store_and_the_frame_of_another_size(stores, form):
    path, where = stores[form]
    for report in (check_path(path.parent, progress=False), check_path(path, progress=False)):
        assert [(f.path, f.reason, f.kind) for f in report.findings if f.kind != "decoder"] == [
            (str(path), MESSAGE.format(where=where), "video")
        ]
        assert not report.ok


@pytest.mark.process  # frame stores are read in DALI's worker processes
@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("form", ["folder", "hdf5"])
def test_dali_decoder_failure_is_named_or_skipped_by_on_bad_sample(stores, form, device):
    """PNG frames (and on a GPU every frame) go through DALI's image decoder and fn.stack: its failure
    is re-checked outside DALI."""
    path, where = stores[form if device == "cpu" else f"{form}_jpg"]
    choice = CPU if device == "cpu" else DeviceChoice("gpu", 0, "test")
    dataset = VideoDataset.from_folder(path.parent)
    with pytest.raises(BadSampleError) as info:
        list(_loader(dataset, choice))
    assert info.value.problems == [(str(path), MESSAGE.format(where=where))]
    assert "\n" not in str(info.value), "one line"
    loader = _loader(dataset, choice, on_bad_sample="skip")
    # Clips 0-4 and 5-9 come before the clip holding frame 13 (DALI may fail before handing them out).
    assert {int(s) for batch in loader for s in batch.start_frames} <= {0, 5}
    assert loader.skipped == {0: MESSAGE.format(where=where)}
    assert list(loader) == [], "and left out of the next epoch"


@pytest.mark.parametrize("form", ["folder_jpg", "hdf5_jpg"])
def test_the_scaled_jpeg_decode_names_the_frame_of_another_size(stores, form):
    """The worker callback itself, called in this process as DALI's workers call it."""
    path, where = stores[form]
    (info,) = VideoDataset.from_folder(path.parent).infos
    clips = ScaledJpegClips(
        lambda k: (np.zeros(1, dtype=np.int64), np.array([BAD - 2])),
        [StoreRef.from_info(info)],
        np.array([[48, 32]]),
        clip_length_frames=5,
        stride_frames=1,
        batch_size=1,
    )
    with pytest.raises(RuntimeError) as info_:
        clips(SimpleNamespace(iteration=0, idx_in_batch=0))
    assert str(info_.value) == f"{path}: {MESSAGE.format(where=where)}"


@pytest.mark.process
def test_the_scaled_jpeg_workers_skip_the_store_under_skip(stores):
    path, where = stores["folder_jpg"]
    loader = _loader(VideoDataset.from_folder(path.parent), on_bad_sample="skip")
    # The workers read ahead, so the failure may come before the clips that precede frame 13 are handed out.
    assert {int(s) for batch in loader for s in batch.start_frames} <= {0, 5}
    assert loader.skipped == {0: MESSAGE.format(where=where)}


def test_the_pyav_decoder_names_the_frame_of_another_size(stores):
    """A set mixing stores and video files reads stores with Pillow in the PyAV workers, fitted to frame 0's size."""
    path, where = stores["hdf5"]
    (info,) = VideoDataset.from_folder(path.parent).infos
    decoder = ClipDecoder()
    try:
        assert decoder.read(VideoRef.from_info(info), np.arange(BAD - 3, BAD)).shape == (3, 64, 96, 3)
        with pytest.raises(ClipDecodeError) as err:
            decoder.read(VideoRef.from_info(info), np.arange(BAD - 2, BAD + 3))
    finally:
        decoder.close()
    assert str(err.value) == f"{path}: {MESSAGE.format(where=where)}"


@pytest.mark.process  # frame stores are read in DALI's worker processes
def test_a_store_without_the_odd_frame_reads_and_checks_clean(stores, tmp_path):
    path, _ = stores["folder"]
    good = tmp_path / "good" / "mouse"
    shutil.copytree(path, good)
    shutil.copy(path.parent / "mouse.csv", good.parent / "mouse.csv")
    (good / f"{BAD:09d}.png").write_bytes((good / f"{BAD - 1:09d}.png").read_bytes())
    assert check_path(good.parent, progress=False).ok
    assert sum(len(b) for b in _loader(VideoDataset.from_folder(good.parent))) == 5
