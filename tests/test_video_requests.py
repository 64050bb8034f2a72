"""The server's checks of an encoded video, before a frame is decoded (server/_video.py), without HTTP.

Each limit (bytes, frames, duration, pixels) and each kind of bad file is refused with its reason and
a message naming the setting or the problem; the temporary file goes with the refusal.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from _serving import CLIP_MODEL, IMAGE_MODEL, exported_repo
from videohelp import encode_tagged_video

from gpufeed.config import parse_config
from gpufeed.models import read_model_card
from gpufeed.pipelines._video_bytes import VideoBytes, sniff_container
from gpufeed.server._errors import RequestError
from gpufeed.server._requests import rest_items
from gpufeed.server._video import VideoUpload, hop_of, open_video

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model():
    return SimpleNamespace(card=read_model_card(exported_repo() / CLIP_MODEL))


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("clip") / "clip.mp4"
    encode_tagged_video(path, 1, 45, labels=False)  # 96x64, 30 fps: 1.5 s
    return path.read_bytes()


def _serve(**limits):
    return parse_config({"serve": limits}).serve


def _refusal(model, cfg, blob, hop=1) -> RequestError:
    with pytest.raises(RequestError) as info:
        open_video(model, cfg, VideoUpload(blob, "input 'video'"), hop, False)
    return info.value


def _temporary_videos() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("gpufeed-video-*")}


@pytest.fixture
def own_tempdir(tmp_path, monkeypatch) -> Path:
    """A temporary folder of the test's own for ``tempfile``: other processes' videos (another pytest
    worker's server tests) never show up in it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_video_within_the_limits_is_probed_not_decoded(model, clip):
    job = open_video(model, _serve(), VideoUpload(clip, "the request body"), 2, True)
    try:
        assert (job.num_frames, job.video.info.codec, job.plan.hop_frames, job.keep_windows) == (45, "h264", 2, True)
        assert job.video.path.suffix == ".mp4" and job.video.path.is_file()
    finally:
        job.video.close()
    assert not job.video.path.exists()


@pytest.mark.parametrize(
    ("limits", "reason", "words"),
    [
        (
            {"max_video_frames": 44},
            "video_too_long",
            "input 'video' holds 45 frames; the limit is 44 (serve.max_video_frames)",
        ),
        (
            {"max_video_seconds": 1.2},
            "video_too_long",
            "input 'video' lasts 1.5 s; the limit is 1.2 s (serve.max_video_seconds)",
        ),
        (
            {"max_image_pixels": 6000},
            "too_many_pixels",
            "frames of 96x64 hold more than 6,000 pixels (serve.max_image_pixels)",
        ),
        ({"max_video_bytes": 2048}, "body_too_large", "the limit is 2,048 (serve.max_video_bytes)"),
    ],
)
def test_each_limit_is_refused_naming_its_setting(model, clip, limits, reason, words, own_tempdir):
    err = _refusal(model, _serve(**limits), clip)
    assert err.reason == reason and words in err.message, err.message
    assert _temporary_videos() == set(), "the refused video's temporary file is gone"


def test_bad_files_and_hops(model, clip):
    assert _refusal(model, _serve(), b"GIF89a....").reason == "unsupported_media_type"
    truncated = _refusal(model, _serve(), clip[: len(clip) - 300])
    assert truncated.reason == "corrupt_video" and truncated.message.startswith("input 'video': truncated")
    assert "gpufeed-video-" not in truncated.message, "the server's temporary path is never shown"
    hop = _refusal(model, _serve(), clip, hop=5)
    assert hop.reason == "malformed_request" and "it must be 1..4" in hop.message
    with pytest.raises(RequestError, match=r"parameters.hop_frames must be an integer >= 1, got 0"):
        hop_of(0, 1, "parameters.hop_frames")
    with pytest.raises(RequestError, match=r"must be an integer >= 1, got True"):
        hop_of(True, 1, "parameters.hop_frames")
    assert hop_of(None, 3, "x") == 3 and hop_of("2", 3, "x") == 2


def test_containers_are_known_from_their_first_bytes(clip):
    assert sniff_container(clip[:16]) == "mp4"
    assert sniff_container(b"RIFF\x00\x00\x00\x00AVI LIST") == "avi"
    assert sniff_container(b"\x1a\x45\xdf\xa3\x00\x00") == "matroska"
    assert sniff_container(b"\xff\xd8\xff\xe0") is None
    with VideoBytes(clip, "a clip") as video:
        assert video.info.num_frames == 45 and video.problem is None


def test_a_clip_models_rest_body_of_another_type_is_told_to_send_a_video(model):
    # curl --data-binary without -H sends application/x-www-form-urlencoded: the answer must point a
    # clip model's caller at video/*, not at the image types an image model takes.
    clip_model = SimpleNamespace(name=CLIP_MODEL, card=model.card, head=model.card.spec.head)
    with pytest.raises(RequestError) as info:
        rest_items(clip_model, _serve(), b"\x00\x00\x00\x18ftypmp42", None, "application/x-www-form-urlencoded")
    assert info.value.reason == "unsupported_media_type"
    assert info.value.message == (
        "Content-Type 'application/x-www-form-urlencoded' is not accepted; model 'clips' is a clip model: send one "
        "encoded video as a video/* body (video/mp4, video/x-msvideo, video/webm, video/x-matroska, video/quicktime)"
    )
    image_card = read_model_card(exported_repo() / IMAGE_MODEL)
    image_model = SimpleNamespace(name=IMAGE_MODEL, card=image_card, head=image_card.spec.head)
    with pytest.raises(RequestError, match=r"'text/plain' is not accepted; send image/jpeg, image/png or multipart"):
        rest_items(image_model, _serve(), b"hello", None, "text/plain")
