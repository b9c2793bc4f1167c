"""The shipped photographs as calibration samples: the default for image inputs.

Six photographs (public domain / CC0, from scikit-image's sample data; see README.md),
256x256 RGB PNGs beside this file. `image_samples` turns them into model inputs: augmented
views (the photograph, its mirror image, a zoomed corner) for calibration, and views not
used there (a mirrored centre zoom) held out to measure the quantized model.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "camera")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R BT.601 RGB -> gray


def load_photos() -> list[np.ndarray]:
    """The shipped photographs as uint8 (256, 256, 3) arrays."""
    photos = []
    for name in PHOTOS:
        with open(os.path.join(HERE, f"{name}.png"), "rb") as f:
            photos.append(decode_png(f.read()))
    return photos


def decode_png(content: bytes) -> np.ndarray:
    """The pixels of an 8-bit RGB, non-interlaced PNG whose rows use the None, Sub or Up
    filters (the shipped photographs are written so): an (H, W, 3) uint8 array, decoded
    without TensorFlow."""
    if content[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    pos, header, data = 8, None, []
    while pos < len(content):
        (size,), kind = struct.unpack(">I", content[pos:pos + 4]), content[pos + 4:pos + 8]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", content[pos + 8:pos + 21])
        elif kind == b"IDAT":
            data.append(content[pos + 8:pos + 8 + size])
        pos += 12 + size
    if header is None or header[2:] != (8, 2, 0, 0, 0):
        raise ValueError(f"PNG header {header}: only 8-bit RGB without interlacing is read")
    width, height = header[:2]
    rows = np.frombuffer(zlib.decompress(b"".join(data)), np.uint8).reshape(height, -1)
    pixels = np.zeros((height, width * 3), np.uint8)
    above = np.zeros(width * 3, np.uint8)
    for y, (kind, row) in enumerate(zip(rows[:, 0], rows[:, 1:])):
        if kind == 1:  # Sub: each byte adds the pixel's to its left, per channel
            row = np.cumsum(row.reshape(width, 3), axis=0, dtype=np.uint8).reshape(-1)
        elif kind == 2:  # Up
            row = row + above
        elif kind != 0:
            raise ValueError(f"PNG row {y}: filter {kind} is not read (None, Sub, Up are)")
        pixels[y] = above = row
    return pixels.reshape(height, width, 3)


def _crop(photo: np.ndarray, fraction: float, where: str) -> np.ndarray:
    size = round(photo.shape[0] * fraction)
    offset = {"top_left": 0, "centre": (photo.shape[0] - size) // 2,
              "bottom_right": photo.shape[0] - size}[where]
    return photo[offset:offset + size, offset:offset + size]


def calibration_views(photo: np.ndarray) -> list[np.ndarray]:
    return [photo, photo[:, ::-1], _crop(photo, 0.75, "top_left")]


def held_out_views(photo: np.ndarray) -> list[np.ndarray]:
    return [_crop(photo, 0.7, "centre")[:, ::-1]]


def _norm(values: Sequence[float] | None, default: Sequence[float], channels: int) -> np.ndarray:
    values = np.asarray(default if values is None else values, np.float32).reshape(-1)
    if channels == 1 and values.size > 1:
        return values.mean(keepdims=True)  # grayscale: the mean of the per-channel values
    if values.size not in (1, channels):
        raise ValueError(f"expected 1 or {channels} normalization values, got {values.size}")
    return np.broadcast_to(values, (channels,))


def image_samples(
    height: int,
    width: int,
    channels: int,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, held_out) float32 arrays of shape (N, height, width, channels): the
    views resized to the model's size (bilinear, antialiased as tf.image.resize's
    antialias=True), pixels in [0, 1] normalized as (x - mean) / std (ImageNet's by
    default; one value, or one per channel). One channel: luma."""
    mean = _norm(mean, IMAGENET_MEAN, channels)
    std = _norm(std, IMAGENET_STD, channels)

    def prepare(views: list[np.ndarray]) -> np.ndarray:
        images = []
        for view in views:
            rows = _resize_weights(view.shape[0], height)
            cols = _resize_weights(view.shape[1], width)
            image = np.einsum("ph,hwc->pwc", rows, view.astype(np.float32) / 255.0)
            images.append(np.einsum("qw,pwc->pqc", cols, image))
        batch = np.clip(np.stack(images), 0.0, 1.0)
        if channels == 1:
            batch = batch @ LUMA[:, np.newaxis]
        return ((batch - mean) / std).astype(np.float32)

    photos = load_photos()
    return (
        prepare([v for p in photos for v in calibration_views(p)]),
        prepare([v for p in photos for v in held_out_views(p)]),
    )


def _resize_weights(size: int, out: int) -> np.ndarray:
    """(out, size) float32 weights of an antialiased bilinear resize of one axis: a
    triangle kernel widened by the downscale factor around each output pixel's centre,
    normalized over the input pixels it covers (TF's scale_and_translate)."""
    inv_scale = size / out
    widen = max(inv_scale, 1.0)
    centres = (np.arange(out) + 0.5) * inv_scale
    offsets = (np.arange(size)[np.newaxis, :] + 0.5 - centres[:, np.newaxis]) / widen
    weights = np.maximum(0.0, 1.0 - np.abs(offsets))
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)
