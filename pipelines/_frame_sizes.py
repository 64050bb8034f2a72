"""One size per frame store: a frame whose header declares another size than frame 0's.

Every frame of a clip is stacked into one (T, H, W, 3) array, and crop windows, scaled JPEG
decodes and the PyAV fitter are all computed from frame 0's size (the index's). A frame of another
size (a camera restarted at a new resolution, a frame replaced by hand) therefore cannot join a
clip: DALI's ``fn.stack`` stops the pipeline without naming a file. This module judges it from the
frame's header alone (:func:`~gpufeed.pipelines.read_image_facts`, no pixel decoded), so
``gpufeed check`` finds it frame by frame and the loaders name the store and the frame, and apply
``loader.on_bad_sample`` to it, like any other bad frame.
"""

from __future__ import annotations

from gpufeed.pipelines._image_facts import read_image_facts

__all__ = ["frame_size_problem"]


def frame_size_problem(data: bytes, where: str, width: int, height: int, facts=None) -> str | None:
    """Why a frame cannot join its store's clips: another size than ``width`` x ``height`` (frame 0's).

    Args:
        data: The frame's encoded bytes (only its header is read).
        where: How to name the frame (its store kind's
            :meth:`~gpufeed.pipelines._frame_stores.FrameStore.frame_label`).
        width, height: The store's frame size, as the index has it (frame 0's, oriented).
        facts: The frame's :class:`~gpufeed.pipelines._image_facts.ImageFacts`, where the caller
            has read them already (``data`` is not read again).

    Returns:
        The reason, naming the frame and both sizes; ``None`` when the size matches, or when the
        header cannot be read (a damaged frame is named by its decode instead).
    """
    facts = read_image_facts(data) if facts is None else facts
    if facts.problem or facts.format not in ("PNG", "JPEG") or not width or not height:
        return None
    if (facts.width, facts.height) == (width, height):
        return None
    return (
        f"{where} is {facts.width}x{facts.height} but frame 0 is {width}x{height}: every frame of a store "
        "must have one size"
    )
