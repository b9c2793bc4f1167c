"""The shipped photographs as calibration samples: the default for image inputs.

Six photographs (public domain / CC0, from scikit-image's sample data; see README.md),
256x256 RGB PNGs beside this file. `image_samples` turns them into model inputs: augmented
views (the photograph, its mirror image, a zoomed corner) for calibration, and views not
used there (a mirrored centre zoom) held out to measure the quantized model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "camera")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R BT.601 RGB -> gray


def load_photos() -> list[np.ndarray]:
    """The shipped photographs as uint8 (256, 256, 3) arrays."""
    import tensorflow as tf

    photos = []
    for name in PHOTOS:
        with open(os.path.join(HERE, f"{name}.png"), "rb") as f:
            photos.append(tf.io.decode_png(f.read(), channels=3).numpy())
    return photos


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
    views resized to the model's size, pixels in [0, 1] normalized as (x - mean) / std
    (ImageNet's by default; one value, or one per channel). One channel: luma."""
    import tensorflow as tf

    mean = _norm(mean, IMAGENET_MEAN, channels)
    std = _norm(std, IMAGENET_STD, channels)

    def prepare(views: list[np.ndarray]) -> np.ndarray:
        images = [
            tf.image.resize(v.astype(np.float32) / 255.0, (height, width), antialias=True)
            .numpy() for v in views
        ]
        batch = np.clip(np.stack(images), 0.0, 1.0)
        if channels == 1:
            batch = batch @ LUMA[:, np.newaxis]
        return ((batch - mean) / std).astype(np.float32)

    photos = load_photos()
    return (
        prepare([v for p in photos for v in calibration_views(p)]),
        prepare([v for p in photos for v in held_out_views(p)]),
    )
