"""A generated corpus of malformed requests for the inference server (``gpufeed bench fuzz`` and its test).

:func:`malformed_corpus` returns well over a thousand :class:`Probe` s, deterministic for a seed,
each a complete request (method, raw path, headers, body) with what the server must answer: a
4xx status, the ``reason`` it must give and words its message must contain. Categories:

=====================  =====================================================================
category               what is wrong
=====================  =====================================================================
truncated_jpeg/png     cut at many points (REST body and KServe BYTES)
corrupt_image          garbage after a valid magic number, missing tables, damaged data
                       behind correct CRCs, zero-size headers, random bytes
bitflip_jpeg/png       1-8 flipped bits anywhere in the file
zero_bytes             empty bodies, empty files, empty BYTES elements
huge_dimensions        headers declaring up to 100000x100000 or 2^31-1 pixels (bombs)
wrong_content_type     a valid JPEG under the wrong Content-Type; GIF/BMP/TIFF/WebP/PDF bytes
malformed_json         truncated and invalid JSON, wrong field types, broken binary framing
oversized              bodies over serve.max_body_bytes (declared, and chunked)
wrong_shape/dtype      tensor shapes and datatypes the model does not take
unknown_model          names not served, other versions
path_like              ``../x``, ``%2e%2e%2f``, ``..%2f..%2fetc%2fpasswd``, NUL, CRLF, ...
long_names             65 to 8000 characters
bad_query, multipart   broken ``top_k``; malformed multipart bodies
wrong_method           GET on inference endpoints, DELETE, PUT
long_integers          integer literals over Python's 4,300-digit limit in every numeric field
bad_unicode            lone surrogates in BYTES data, names, ids; invalid UTF-8
content_encoding       gzip/deflate bombs, corrupt or truncated compressed bodies, unknown codings
large_json             bodies near the limit of ``[],`` runs, too many values, huge declared shapes
large_heads            request heads over ``serve.max_header_bytes`` (431)
=====================  =====================================================================

The hostile categories (the last five) are :mod:`gpufeed.reliability._corpus_hostile`.

A flipped bit inside JPEG entropy-coded data (or inside PNG data that a decoder tolerates) can
leave a file that still decodes, to different pixels: no checksum can tell. Those probes carry
``may_decode``: a 200 answer is then acceptable; every other answer must still be a proper 4xx.
"""

from __future__ import annotations

import numpy as np

from gpufeed.reliability._corpus_hostile import hostile_probes, large_head_probes
from gpufeed.reliability._corpus_images import image_probes
from gpufeed.reliability._corpus_requests import json_probes, name_probes, oversized_probes, rest_probes, tensor_probes
from gpufeed.reliability._probe import Builder, Probe, Target
from gpufeed.synth import format_samples

__all__ = ["Probe", "Target", "malformed_corpus"]


def malformed_corpus(
    targets: list[Target],
    *,
    max_body_bytes: int,
    max_image_pixels: int,
    max_images_per_request: int,
    max_header_bytes: int = 64 * 1024,
    seed: int = 0,
) -> list[Probe]:
    """Every malformed request of the corpus for the served ``targets`` (deterministic for ``seed``).

    Args:
        targets: The served models (image models get the image categories).
        max_body_bytes, max_image_pixels, max_images_per_request, max_header_bytes: The server's
            limits (``serve.*``): the oversized, huge-dimension, too-many-rows and large-head probes
            are sized against them.
    """
    rng = np.random.default_rng(seed)
    images = format_samples(rng)
    probes: list[Probe] = []
    served = [t.name for t in targets]
    for k, target in enumerate(targets):
        b = Builder(target)
        if target.accepts_images:
            image_probes(b, rng, images, max_image_pixels)
            rest_probes(b, images["jpeg"])
        json_probes(b, rng)
        tensor_probes(b, max_images_per_request, max_body_bytes)
        hostile_probes(b, max_body_bytes=max_body_bytes, max_images=max_images_per_request, jpeg=images["jpeg"])
        if k == 0:
            name_probes(b, served, images["jpeg"])
            oversized_probes(b, max_body_bytes, images["jpeg"])
            large_head_probes(b, max_header_bytes)
        probes += b.probes
    return probes
