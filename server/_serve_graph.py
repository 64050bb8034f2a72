"""The server's DALI decode graph (:class:`gpufeed.server._preprocess.ImageDecoder` builds and runs it).

The evaluation loader's own decode-crop-resize fragment (:func:`gpufeed.pipelines.decode_window`)
fed by external sources, then a transpose to CHW: see :mod:`gpufeed.server._preprocess`.
"""

from __future__ import annotations

from gpufeed.core import SizePx
from gpufeed.pipelines import decode_window

__all__ = ["serve_pipeline"]


def serve_pipeline(
    size_px: SizePx, max_batch: int, device_id: int | None, num_threads: int, gpu_options: dict | None = None
):
    """The server's decode graph, defined but not built (:class:`~gpufeed.server._preprocess.ImageDecoder` builds it).

    Args:
        size_px: Output size.
        max_batch: Most samples per call.
        device_id: CUDA device, or ``None`` for the CPU.
        num_threads: DALI CPU threads.
        gpu_options: The ``mixed`` decoder's arguments: the evaluation loader's
            (:func:`gpufeed.pipelines._image_pipeline.eval_decoder_options`).
    """
    from nvidia.dali import fn, pipeline_def, types

    on_gpu = device_id is not None

    @pipeline_def(enable_conditionals=False)
    def serve_graph():
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        anchor = fn.external_source(name="anchor", dtype=types.INT32, ndim=1)
        shape = fn.external_source(name="shape", dtype=types.INT32, ndim=1)
        roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1)
        roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1)
        out_size = fn.external_source(name="out_size", dtype=types.FLOAT, ndim=1)
        # The evaluation loader's own fragment and decoder options: serving decodes, crops and
        # resamples exactly as evaluation.
        images = decode_window(
            encoded,
            anchor,
            shape,
            roi_start,
            roi_end,
            size_px=size_px,
            on_gpu=on_gpu,
            gpu_options=gpu_options,
            out_size=out_size,
        )
        return fn.transpose(images, perm=[2, 0, 1], output_layout="CHW")

    return serve_graph(
        batch_size=max_batch,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=1,
        exec_dynamic=True,
    )
