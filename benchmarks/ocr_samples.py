"""Calibration and held-out inputs for trained vision models, made of text rendered onto
photographs, for benchmarks/bench_int8_heldout.py.

    python benchmarks/ocr_samples.py OUT_DIR [--kind det|rec|cls|photo] [--size 640]
        [--skimage-data DIR] [--held-count 8]

Needs Pillow (not a dependency of the package). Writes OUT_DIR/cal.npy (16 samples made from
the six photographs in calibration/), OUT_DIR/held.npy (8 samples, or --held-count, from
other photographs, other words and fonts) and OUT_DIR/held_light.npy (the same under other
light and another camera: `relit`), in ONNX layout (N, 3, H, W), float32:
- det (PP-OCR's DB text detector): size x size crops, 13 of the calibration ones with 1-4
  lines of text pasted on and 3 without text, as a user's folder has; every held-out one
  with text; normalized (x / 255 - mean) / std with ImageNet's mean and std;
- rec / cls (PP-OCR's recognizer, 48 x 320, and direction classifier, 48 x 192): one line of
  text on a photograph strip, (x / 255 - 0.5) / 0.5; for cls half of them upside down;
- photo (an object detector such as YOLO): size x size crops, x / 255.
--skimage-data names the `skimage/data` folder of a scikit-image wheel (`pip download
--no-deps scikit-image`, then unzip), whose photographs the held-out samples are made of.
"""

from __future__ import annotations

import argparse
import glob
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFont

HERE = os.path.dirname(os.path.abspath(__file__))
CALIBRATION_PHOTOS = sorted(glob.glob(os.path.join(HERE, "..", "calibration", "*.png")))
HELD_OUT_PHOTOS = ["brick.png", "grass.png", "gravel.png", "coins.png", "moon.png",
                   "motorcycle_left.png", "retina.jpg", "ihc.png"]
FONTS = "/usr/share/fonts/truetype/dejavu"
CAL_WORDS = ["invoice", "total 42.50", "OPEN DAILY", "exit", "Station 7", "menu", "SALE -30%",
             "room 214", "keep left", "fresh bread", "No parking", "2024-05-01"]
HELD_WORDS = ["Quarterly report", "EMERGENCY", "platform 9", "tel. 555 0199", "gluten free",
              "welcome home", "Lot 88", "danger: high voltage", "coffee & tea", "page 12"]
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def _crop(photo: Image.Image, rng: np.random.Generator, size: int) -> Image.Image:
    photo = photo.convert("RGB")
    w, h = photo.size
    side = int(min(w, h) * rng.uniform(0.6, 1.0))
    left, top = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
    return photo.crop((left, top, left + side, top + side)).resize((size, size))


def _write_text(image: Image.Image, rng: np.random.Generator, words: list[str],
                fonts: list[str], lines: int) -> None:
    draw = ImageDraw.Draw(image)
    size = image.size[0]
    for _ in range(lines):
        font = ImageFont.truetype(str(rng.choice(fonts)), int(rng.integers(size // 28, size // 10)))
        text = str(rng.choice(words))
        x, y = int(rng.integers(0, size * 2 // 3)), int(rng.integers(0, size * 7 // 8))
        box = draw.textbbox((x, y), text, font=font)
        dark = rng.random() < 0.5
        back = (245, 245, 235) if dark else (20, 20, 30)
        draw.rectangle((box[0] - 6, box[1] - 4, box[2] + 6, box[3] + 4), fill=back)
        draw.text((x, y), text, font=font, fill=(10, 10, 10) if dark else (250, 250, 240))


def relit(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """The photograph under other light, taken by another camera: a gamma and exposure
    change, a colour cast, sensor noise, a slight blur and JPEG compression."""
    from io import BytesIO

    from PIL import ImageFilter

    x = np.asarray(image, np.float32) / 255.0
    x = x ** rng.uniform(0.55, 1.8) * rng.uniform(0.6, 1.3)
    x = x * rng.uniform(0.8, 1.2, size=3) + rng.normal(0.0, rng.uniform(0.01, 0.04), x.shape)
    shot = Image.fromarray((np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8))
    shot = shot.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.0, 1.2))))
    stream = BytesIO()
    shot.save(stream, "JPEG", quality=int(rng.integers(35, 80)))
    return Image.open(BytesIO(stream.getvalue())).convert("RGB")


def _normalized(image: Image.Image, kind: str = "det") -> np.ndarray:
    x = np.asarray(image, np.float32) / 255.0
    if kind == "det":
        x = (x - MEAN) / STD
    elif kind in ("rec", "cls"):
        x = (x - 0.5) / 0.5
    return x.transpose(2, 0, 1)


def text_lines(photos: list[str], words: list[str], fonts: list[str], count: int,
               width: int, seed: int, flip_half: bool, light: bool = False) -> np.ndarray:
    """`count` 48-pixel-high strips of a photograph with one line of text each; `light`:
    each taken under other light (`relit`), the text the same as without."""
    rng = np.random.default_rng(seed)
    shots = np.random.default_rng(seed + 100)
    out = []
    for k in range(count):
        photo = Image.open(photos[k % len(photos)]).convert("RGB")
        w, h = photo.size
        top = int(rng.integers(0, h - h // 8))
        strip = photo.crop((0, top, w, top + h // 8)).resize((width, 48))
        draw = ImageDraw.Draw(strip)
        font = ImageFont.truetype(str(rng.choice(fonts)), int(rng.integers(24, 36)))
        text = " ".join(str(w) for w in rng.choice(words, 2))
        box = draw.textbbox((4, 4), text, font=font)
        dark = rng.random() < 0.5
        draw.rectangle((0, 0, min(width, box[2] + 8), 48),
                       fill=(240, 240, 230) if dark else (25, 25, 35))
        draw.text((4, 4), text, font=font, fill=(10, 10, 10) if dark else (250, 250, 240))
        if flip_half and k % 2:
            strip = strip.rotate(180)
        if light:
            strip = relit(strip, shots)
        out.append(_normalized(strip, "rec"))
    return np.stack(out).astype(np.float32)


def samples(photos: list[str], words: list[str], fonts: list[str], count: int, blank: int,
            size: int, seed: int, kind: str = "det", light: bool = False) -> np.ndarray:
    """`count` samples, the last `blank` of them without text; `light`: as `text_lines`."""
    rng = np.random.default_rng(seed)
    shots = np.random.default_rng(seed + 100)
    out = []
    for k in range(count):
        image = _crop(Image.open(photos[k % len(photos)]), rng, size)
        if k < count - blank:
            _write_text(image, rng, words, fonts, int(rng.integers(1, 5)))
        if light:
            image = relit(image, shots)
        out.append(_normalized(image, kind))
    return np.stack(out).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--kind", choices=["det", "rec", "cls", "photo"], default="det")
    parser.add_argument("--size", type=int, default=640)
    parser.add_argument("--skimage-data", default="/tmp/skimg/skimage/data")
    parser.add_argument("--held-count", type=int, default=8,
                        help="held-out samples (the first 8 are the same whatever the count)")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    cal_fonts = [f"{FONTS}/DejaVuSans.ttf", f"{FONTS}/DejaVuSans-Bold.ttf"]
    held_fonts = [f"{FONTS}/DejaVuSerif.ttf", f"{FONTS}/DejaVuSansMono.ttf",
                  f"{FONTS}/DejaVuSerif-Bold.ttf"]
    held_photos = [os.path.join(args.skimage_data, p) for p in HELD_OUT_PHOTOS]
    if args.kind in ("rec", "cls"):
        width, flip = (320, False) if args.kind == "rec" else (192, True)
        cal = text_lines(CALIBRATION_PHOTOS, CAL_WORDS, cal_fonts, 16, width, 1, flip)
        held, light = (text_lines(held_photos, HELD_WORDS, held_fonts, args.held_count, width, 2,
                                  flip, light=lit) for lit in (False, True))
    else:
        text = args.kind == "det"
        cal = samples(CALIBRATION_PHOTOS, CAL_WORDS, cal_fonts, 16, 3 if text else 16,
                      args.size, seed=1, kind=args.kind)
        held, light = (samples(held_photos, HELD_WORDS, held_fonts, args.held_count,
                               0 if text else args.held_count, args.size, seed=2,
                               kind=args.kind, light=lit)
                       for lit in (False, True))
    for name, data in (("cal", cal), ("held", held), ("held_light", light)):
        np.save(os.path.join(args.out_dir, f"{name}.npy"), data)
    print(f"cal.npy {cal.shape}, held.npy and held_light.npy {held.shape} in {args.out_dir}")


if __name__ == "__main__":
    main()
