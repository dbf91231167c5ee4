"""Token estimates for images and documents, from their size (pure).

Base64 images: the real dimensions read from the PNG, GIF, WebP or JPEG header, then the
provider's formula (long edge scaled to ``IMAGE_MAX_EDGE``, w·h/750, capped at
``FIXED_MEDIA_TOKENS``); unreadable images and url/file sources count ``FIXED_MEDIA_TOKENS``.
PDFs: ``PDF_PAGE_TOKENS`` per page, pages counted from ``/Type /Page`` objects, else one page per
``PDF_BYTES_PER_PAGE`` bytes.
"""

from __future__ import annotations

import binascii
import math
import re

FIXED_MEDIA_TOKENS = 1600  # an image at the provider's size cap; also url/file media
IMAGE_MAX_EDGE = 1568
PDF_PAGE_TOKENS = 3000
PDF_BYTES_PER_PAGE = 50_000

_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")
_IMAGE_HEADER_CHARS = 262_144  # base64 characters decoded to find an image's dimensions


def _image_tokens(source: object) -> int:
    if not isinstance(source, dict) or source.get("type") != "base64":
        return FIXED_MEDIA_TOKENS
    data = source.get("data")
    if not isinstance(data, str):
        return FIXED_MEDIA_TOKENS
    size = image_dimensions(data)
    if size is None:
        return FIXED_MEDIA_TOKENS
    width, height = size
    long_edge = max(width, height)
    if long_edge > IMAGE_MAX_EDGE:
        scale = IMAGE_MAX_EDGE / long_edge
        width, height = max(1, round(width * scale)), max(1, round(height * scale))
    return max(1, min(FIXED_MEDIA_TOKENS, math.ceil(width * height / 750)))


def image_dimensions(data: str) -> tuple[int, int] | None:
    """(width, height) of a base64 PNG, GIF, WebP or JPEG, from its header; None if unknown."""
    head_chars = data[:_IMAGE_HEADER_CHARS]
    head_chars = head_chars[: len(head_chars) - len(head_chars) % 4]
    try:
        head = binascii.a2b_base64(head_chars)
    except (binascii.Error, ValueError):
        return None
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP" and len(head) >= 30:
        chunk = head[12:16]
        if chunk == b"VP8X":
            return 1 + int.from_bytes(head[24:27], "little"), 1 + int.from_bytes(
                head[27:30], "little"
            )
        if chunk == b"VP8 ":
            return (
                int.from_bytes(head[26:28], "little") & 0x3FFF,
                int.from_bytes(head[28:30], "little") & 0x3FFF,
            )
        if chunk == b"VP8L":
            bits = int.from_bytes(head[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        return None
    if head[:2] == b"\xff\xd8":
        return _jpeg_dimensions(head)
    return None


def _jpeg_dimensions(head: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        length = int.from_bytes(head[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # start of frame
            height = int.from_bytes(head[i + 5 : i + 7], "big")
            width = int.from_bytes(head[i + 7 : i + 9], "big")
            return (width, height) if width and height else None
        i += 2 + length
    return None


def _pdf_tokens(data: str) -> int:
    try:
        pdf = binascii.a2b_base64(data)
    except (binascii.Error, ValueError):
        return math.ceil(len(data) * 3 / 4 / PDF_BYTES_PER_PAGE) * PDF_PAGE_TOKENS
    pages = len(_PDF_PAGE.findall(pdf)) or max(1, math.ceil(len(pdf) / PDF_BYTES_PER_PAGE))
    return pages * PDF_PAGE_TOKENS


