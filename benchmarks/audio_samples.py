"""Calibration and held-out inputs for trained audio models, made of synthesized music, for
benchmarks/bench_int8_heldout.py.

    python benchmarks/audio_samples.py OUT_DIR [--rate 22050] [--length 43844]

Writes OUT_DIR/cal.npy (16 clips), OUT_DIR/held.npy (8 clips) and OUT_DIR/held_mic.npy (the
same 8 as a phone would record them: `recorded`), float32 (N, length, 1),
mono in [-1, 1] at `rate` (defaults: Spotify basic-pitch's 2-second window). Nothing is
downloaded; the clips are notes, not recordings:
- calibration: melodies and chords of decaying harmonic tones (a plucked-string
  spectrum), tempo 90-150, some with noise-burst drums; 3 of the 16 hold no note at all
  (silence with hiss, drums alone), as a user's folder of clips does;
- held out: other timbres (sawtooth-like and hollow square-like spectra with vibrato and slow
  attacks), other keys and tempi, a room echo, louder and quieter: every clip with notes.
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def _tone(rng, freq: float, seconds: float, rate: int, timbre: str) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    if timbre == "pluck":
        partials, attack, decay, vibrato = [1.0 / k ** 1.5 for k in range(1, 9)], 0.005, 3.0, 0.0
    elif timbre == "saw":
        partials, attack, decay, vibrato = [1.0 / k for k in range(1, 13)], 0.04, 0.8, 5.5
    else:  # hollow: odd partials
        partials = [1.0 / k if k % 2 else 0.0 for k in range(1, 12)]
        attack, decay, vibrato = 0.08, 0.5, 4.0
    phase = 2 * np.pi * freq * t + (0.004 * np.sin(2 * np.pi * vibrato * t) * freq / 4
                                    if vibrato else 0.0)
    wave = sum(a * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
               for k, a in enumerate(partials, 1) if a and k * freq < rate / 2)
    envelope = np.minimum(t / attack, 1.0) * np.exp(-decay * t)
    return wave * envelope


def _clip(rng, rate: int, length: int, timbre: str | None, drums: bool, key: int,
          tempo: float, echo: bool) -> np.ndarray:
    audio = rng.normal(0, 0.002, length)  # hiss
    beat = 60.0 / tempo
    if timbre is not None:
        scale = key + np.array([0, 2, 4, 5, 7, 9, 11, 12])
        start = 0.0
        while start * rate < length:
            chord = rng.random() < 0.3
            notes = scale[rng.integers(0, 8, 3 if chord else 1)] + 12 * rng.integers(0, 2)
            for midi in notes:
                tone = _tone(rng, 440.0 * 2 ** ((midi - 69) / 12), beat * 2, rate, timbre)
                begin = int(start * rate)
                piece = tone[:max(0, length - begin)]
                audio[begin:begin + len(piece)] += piece * rng.uniform(0.2, 0.5)
            start += beat * rng.choice([0.5, 1.0, 1.0, 2.0])
    if drums:
        for k in range(int(length / rate / beat) + 1):
            begin = int(k * beat * rate)
            burst = rng.normal(0, 0.3, int(0.05 * rate)) * np.exp(-np.arange(int(0.05 * rate)) / 300)
            piece = burst[:max(0, length - begin)]
            audio[begin:begin + len(piece)] += piece
    if echo:
        delay = int(0.09 * rate)
        audio[delay:] += 0.35 * audio[:-delay]
    peak = np.abs(audio).max()
    return (audio / peak * rng.uniform(0.3, 0.95) if peak > 0.01 else audio).astype(np.float32)


def recorded(clip: np.ndarray, rng: np.random.Generator, rate: int) -> np.ndarray:
    """The clip as a phone's microphone in a room records it: a band of about 150 Hz to
    3.5-6 kHz, a level 12 dB lower to 3 dB higher, room noise 20-35 dB below the music, soft
    clipping where it is loud."""
    spectrum = np.fft.rfft(clip)
    freqs = np.fft.rfftfreq(len(clip), 1.0 / rate)
    low, high = 150.0, rng.uniform(3500.0, 6000.0)
    band = 1.0 / np.sqrt(1.0 + (low / np.maximum(freqs, 1.0)) ** 4) / np.sqrt(
        1.0 + (freqs / high) ** 4)
    out = np.fft.irfft(spectrum * band, len(clip)) * 10 ** (rng.uniform(-12.0, 3.0) / 20)
    noise = np.cumsum(rng.normal(size=len(clip)))  # a rumbling room: brown noise, centred
    noise = (noise - np.convolve(noise, np.ones(256) / 256, "same")).astype(np.float64)
    level = np.sqrt(np.mean(out ** 2)) / np.sqrt(np.mean(noise ** 2)) * 10 ** (
        -rng.uniform(20.0, 35.0) / 20)
    return np.tanh(1.5 * (out + noise * level)) / np.tanh(1.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--rate", type=int, default=22050)
    parser.add_argument("--length", type=int, default=43844)
    args = parser.parse_args()
    rng = np.random.default_rng(2026)
    cal = []
    for k in range(16):
        if k in (4, 9, 14):  # no note: hiss, or drums alone
            cal.append(_clip(rng, args.rate, args.length, None, k == 9, 0, 120, False))
        else:
            cal.append(_clip(rng, args.rate, args.length, "pluck", k % 3 == 0,
                             int(rng.integers(48, 60)), rng.uniform(90, 150), False))
    held = [_clip(rng, args.rate, args.length, ("saw", "hollow")[k % 2], k % 4 == 1,
                  int(rng.integers(55, 67)), rng.uniform(70, 170), k % 3 == 0)
            for k in range(8)]
    mic = np.random.default_rng(7)
    recordings = [recorded(clip, mic, args.rate).astype(np.float32) for clip in held]
    os.makedirs(args.out_dir, exist_ok=True)
    for name, clips in (("cal", cal), ("held", held), ("held_mic", recordings)):
        array = np.stack(clips)[..., None]
        np.save(os.path.join(args.out_dir, f"{name}.npy"), array)
        print(f"{name}.npy {array.shape}")


if __name__ == "__main__":
    main()
