"""Image payloads for the corpus: damaged, truncated, bit-flipped and bomb-sized JPEG and PNG files.

The damage itself is :mod:`gpufeed.synth._damaged`; the valid images it starts from are
:func:`gpufeed.synth._photos.format_samples`.
"""

from __future__ import annotations

import json

import numpy as np

from gpufeed.reliability._probe import Builder
from gpufeed.synth import declare_size, jpeg_without_segment, png_chunk, png_declaring, png_with_damaged_data

__all__ = ["image_probes"]


CORRUPT = ("corrupt_image",)
FORMAT_WORDS = ("truncated", "damaged", "not a jpeg or png", "empty", "no valid header")


def image_probes(b: Builder, rng: np.random.Generator, images: dict[str, bytes], max_pixels: int) -> None:
    # One category after another reuses these with other lengths.
    statuses: tuple[int, ...]
    reasons: tuple[str, ...]
    words: tuple[str, ...]
    # Truncated: cut points spread over each file, sent as a raw REST body and as a KServe BYTES element.
    for category, keys in (("truncated_jpeg", ("jpeg", "jpeg_progressive")), ("truncated_png", ("png", "png_small"))):
        for key in keys:
            blob = images[key]
            cuts = np.unique(np.linspace(1, len(blob) - 1, 50).astype(int))
            for k, cut in enumerate(cuts):
                part = blob[:cut]
                if k % 2 == 0:
                    b.rest(category, part, "image/png" if "png" in key else "image/jpeg", (400,), CORRUPT, FORMAT_WORDS)
                else:
                    b.kserve_images(category, [part], (400,), CORRUPT, FORMAT_WORDS)
    # Structurally corrupt.
    jpeg, png = images["jpeg"], images["png"]
    corrupt = [  # (bytes, may still decode)
        *((b"\xff\xd8\xff" + rng.bytes(n), False) for n in (1, 10, 100, 1000, 5000)),
        *((b"\x89PNG\r\n\x1a\n" + rng.bytes(n), False) for n in (1, 10, 100, 1000, 5000)),
        *((rng.bytes(n), False) for n in (1, 2, 16, 300, 4000)),
        (jpeg_without_segment(jpeg, 0xC4), True),  # no Huffman tables: decoders fall back to the standard ones
        (jpeg_without_segment(jpeg, 0xDB), False),  # no quantisation tables
        (declare_size(jpeg, 0, 72), False),
        (declare_size(jpeg, 96, 0), False),
        (jpeg[:620] + bytes(len(jpeg) - 622) + b"\xff\xd9", True),  # zeroed scan data is valid: a flat image
        (png_with_damaged_data(png), False),
        (png[:33] + png_chunk(b"IDAT", b"not zlib at all" * 4) + png_chunk(b"IEND", b""), False),
        (png[:16] + b"\x00" * 8 + png[24:], False),  # IHDR says 0x0 (and its CRC is now wrong)
        (png.replace(b"IEND", b"IENX"), False),
        (png[:8] + png_chunk(b"IHDR", png[16:29], crc=0) + png[33:], False),
    ]
    statuses, reasons = (400, 415), (*CORRUPT, "unsupported_media_type")
    for k, (blob, may) in enumerate(corrupt):
        words = (*FORMAT_WORDS, "empty size", "supported formats")
        if k % 2 == 0:
            b.rest("corrupt_image", blob, "image/jpeg", statuses, reasons, words, may_decode=may)
        else:
            b.kserve_images("corrupt_image", [blob], statuses, reasons, words, may_decode=may)
    # Bit flips.
    for category, key in (("bitflip_jpeg", "jpeg"), ("bitflip_png", "png")):
        blob = images[key]
        for k in range(200):
            data = bytearray(blob)
            for _ in range(int(rng.integers(1, 9))):
                at = int(rng.integers(0, len(data) * 8))
                data[at // 8] ^= 1 << (at % 8)
            statuses, reasons = (400, 415), (*CORRUPT, "unsupported_media_type", "too_many_pixels")
            words = (*FORMAT_WORDS, "pixels", "supported formats", "empty size")
            ct = "image/png" if key == "png" else "image/jpeg"
            if k % 3 == 2:
                b.kserve_images(category, [bytes(data)], statuses, reasons, words, may_decode=True)
            else:
                b.rest(category, bytes(data), ct, statuses, reasons, words, may_decode=True)
    # Zero bytes.
    for ct in ("image/jpeg", "image/png", "image/jpg"):
        b.rest("zero_bytes", b"", ct, (400,), CORRUPT, ("empty",))
    b.multipart("zero_bytes", b"", (400,), CORRUPT, ("empty",))
    b.kserve_images("zero_bytes", [b""], (400,), CORRUPT, ("empty",))
    b.kserve_images("zero_bytes", [jpeg, b""], (400,), CORRUPT, ("empty",))
    b.kserve_doc("zero_bytes", {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [""]}]},
                 (400,), CORRUPT, ("empty",))  # fmt: skip
    b.kserve_doc("zero_bytes", b"", (400,), ("malformed_request",), ("json",))
    b.rest("zero_bytes", b"", "multipart/form-data; boundary=bnd", (400,), ("malformed_request",), ("boundary",))
    b.kserve_doc("zero_bytes", {}, (400,), ("malformed_request",), ("inputs",))
    # Huge declared dimensions.
    side = int(max_pixels**0.5) + 1
    sizes = [(100000, 100000), (65535, 65535), (2**31 - 1, 1), (1, 2**31 - 1), (50000, 3000), (side, side)]
    for width, height in sizes:
        png_bomb = png_declaring(width, height)
        words = ("pixels",)
        b.rest("huge_dimensions", png_bomb, "image/png", (400,), ("too_many_pixels",), words)
        b.multipart("huge_dimensions", png_bomb, (400,), ("too_many_pixels",), words, filename="bomb.png")
        b.kserve_images("huge_dimensions", [png_bomb], (400,), ("too_many_pixels",), words)
        if width <= 65535 and height <= 65535:
            jpeg_bomb = declare_size(jpeg, width, height)
            b.rest("huge_dimensions", jpeg_bomb, "image/jpeg", (400,), ("too_many_pixels",), words)
            b.kserve_images("huge_dimensions", [jpeg_bomb], (400,), ("too_many_pixels",), words)
    # Wrong content types and formats.
    for ct in ("text/plain", "application/json", "application/octet-stream", "image/gif", "image/webp", "image/bmp",
               "image", "image/", "garbage", "multipart/mixed", "application/x-www-form-urlencoded",
               "text/html; charset=utf-8", "video/mp4", ";", "x" * 300):  # fmt: skip
        b.rest("wrong_content_type", jpeg, ct, (415,), ("unsupported_media_type",), ("content-type",))
    b.add("wrong_content_type", "POST", b.predict, jpeg, {415}, {"unsupported_media_type"}, ("content-type",))
    for fmt in ("gif", "bmp", "tiff", "webp"):
        words = ("supported formats",)
        b.rest("wrong_content_type", images[fmt], "image/jpeg", (415,), ("unsupported_media_type",), words)
        b.kserve_images("wrong_content_type", [images[fmt]], (415,), ("unsupported_media_type",), words)
    b.rest(
        "wrong_content_type", b"%PDF-1.4\n" + rng.bytes(200), "image/png", (415,), ("unsupported_media_type",), ("PDF",)
    )
    b.rest("wrong_content_type", jpeg, "multipart/form-data", (400,), ("malformed_request",), ("boundary",))
    header = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}
    b.add("wrong_content_type", "POST", b.infer, json.dumps(header).encode(), {415}, {"unsupported_media_type"},
          ("content-encoding",), (("Content-Encoding", "br"),))  # fmt: skip
