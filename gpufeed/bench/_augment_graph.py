"""The DALI side of ``gpufeed bench augment``: the marginal cost of an op inside the loader's graph.

A graph holds one fixed batch of resized uint8 images, already on the loader's device (so no
decode and no host-to-device copy blur the figure), and optionally an augmentation fragment after
it. Running it back to back with and without the fragment, interleaved, gives the fragment's cost
per batch as the difference of the medians: what it adds to the loader's work on that device.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from gpufeed.core import SizePx
from gpufeed.pipelines import LoaderAugment, RowsFeed, augment_graph

__all__ = ["GraphTimer", "graph_variants"]

Fragment = Callable[[object, int], object]


def _loader_fragment(augment: LoaderAugment, rows_needed: int, seed: int) -> Fragment:
    rows = augment.rows(seed, 0, np.arange(rows_needed))

    def fragment(images, batch_size: int):
        return augment_graph(images, rows, batch_size)

    return fragment


def _color_twist_fragment(augment: LoaderAugment, rows_needed: int, seed: int) -> Fragment:
    """DALI's own ``fn.color_twist`` with the same per-sample factors, for comparison."""
    from nvidia.dali import fn, types

    jitter = augment.jitter
    if jitter is None:
        raise ValueError("the loader's augmentation has no colour jitter to compare with fn.color_twist")
    u = augment.uniforms(seed, 0, np.arange(rows_needed))

    def spread(column: int, r: float) -> np.ndarray:
        lo = max(0.0, 1.0 - r)
        return (lo + (1.0 + r - lo) * u[:, column]).astype(np.float32)

    columns = [spread(1, jitter.brightness), spread(2, jitter.contrast), spread(3, jitter.saturation)]
    columns.append((360.0 * jitter.hue * (2.0 * u[:, 4] - 1.0)).astype(np.float32))

    def fragment(images, batch_size: int):
        b, c, s, h = fn.external_source(
            source=RowsFeed(columns, batch_size), num_outputs=4, batch=True, dtype=[types.DALIDataType.FLOAT] * 4
        )
        return fn.color_twist(images, brightness=b, contrast=c, saturation=s, hue=h)

    return fragment


def graph_variants(jitter_augment: LoaderAugment, grayscale_p: float, rows_needed: int, seed: int) -> dict:
    """name -> (op, how, fragment) for every loader op worth timing; ``None`` is the bare graph."""
    both = LoaderAugment(jitter=jitter_augment.jitter, grayscale_p=grayscale_p)
    return {
        "none": None,
        "color_jitter": ("color_jitter", "coord_transform", _loader_fragment(jitter_augment, rows_needed, seed)),
        "grayscale": (
            "grayscale",
            "coord_transform",
            _loader_fragment(LoaderAugment(grayscale_p=grayscale_p), rows_needed, seed),
        ),
        "color_jitter+grayscale": (
            "color_jitter+grayscale",
            "coord_transform (one matrix)",
            _loader_fragment(both, rows_needed, seed),
        ),
        "color_twist": ("color_jitter", "fn.color_twist", _color_twist_fragment(jitter_augment, rows_needed, seed)),
        "flip": ("horizontal_flip", "fn.flip (clips)", _loader_fragment(LoaderAugment(flip_p=0.5), rows_needed, seed)),
    }


def _build(fragment: Fragment | None, batch, *, batch_size: int, device_id: int | None, num_threads: int):
    from nvidia.dali import fn, pipeline_def, types

    on_gpu = device_id is not None

    @pipeline_def(enable_conditionals=False)
    def graph():
        images = fn.external_source(
            source=lambda: batch, batch=True, device="gpu" if on_gpu else "cpu", layout="HWC", dtype=types.UINT8
        )
        return images if fragment is None else fragment(images, batch_size)

    pipe = graph(
        batch_size=batch_size, num_threads=num_threads, device_id=device_id, prefetch_queue_depth=2, exec_dynamic=True
    )
    pipe.build()
    return pipe


class GraphTimer:
    """The variants' graphs, built once over one fixed batch; :meth:`round` times each in turn.

    Args:
        variants: From :func:`graph_variants`.
        iterations: Batches per variant and round.
    """

    def __init__(
        self,
        variants: dict,
        *,
        batch_size: int,
        size_px: SizePx,
        device_id: int | None,
        num_threads: int,
        iterations: int,
        seed: int = 0,
    ) -> None:
        import torch

        pixels = np.random.default_rng(seed).integers(0, 256, (batch_size, *size_px.hw, 3), dtype=np.uint8)
        # On a GPU, DALI reads the batch through __cuda_array_interface__.
        batch = pixels if device_id is None else torch.from_numpy(pixels).cuda(device_id)
        self.device_id, self.iterations = device_id, iterations
        self._turn = -1
        self.pipes = {
            name: _build(
                None if spec is None else spec[2],
                batch,
                batch_size=batch_size,
                device_id=device_id,
                num_threads=num_threads,
            )
            for name, spec in variants.items()
        }
        for pipe in self.pipes.values():
            pipe.run()

    def _sync(self) -> None:
        if self.device_id is not None:
            import torch

            torch.cuda.synchronize(self.device_id)

    def round(self) -> dict[str, float]:
        """Seconds per batch of every variant, measured once each.

        One untimed batch of each first, and a rotating order, so that whatever ran just before
        (on a CPU, the training framework's threads still spinning) weighs on no variant more
        than on the others.
        """
        for pipe in self.pipes.values():
            pipe.run()
        self._turn = (self._turn + 1) % len(self.pipes)
        names = list(self.pipes)
        out = {}
        for name in names[self._turn :] + names[: self._turn]:
            pipe = self.pipes[name]
            self._sync()
            start = time.perf_counter()
            for _ in range(self.iterations):
                pipe.run()
            self._sync()
            out[name] = (time.perf_counter() - start) / self.iterations
        return out
