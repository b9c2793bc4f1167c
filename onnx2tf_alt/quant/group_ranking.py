"""Which segments of an INT8 file lose the most accuracy, measured without gradients: by
keeping groups of them in float, re-quantizing (the own quantizer: a tenth of a second)
and measuring the outputs, splitting the groups that gain most (--keep_float_auto on the
direct writer's file, which has no TF model to differentiate).

Each activation tensor's rounding adds its own error to the outputs; to first order the
output error energy is the sum of those contributions, and the output cosine lost is half
the relative energy. Keeping a group of segments in float removes its contributions, so
the cosine a group gains is the sum of its members' gains: measure a group, then one of
its halves, and the other half's gain is the difference. A best-first descent into the
group that gains most reaches a single segment in about log2(segments) measurements, and
every group measured or inferred on the way keeps its gain: after the budget, the segments
are ranked by their own gain where it was reached, else by their group's gain shared out by
size (a member of a group that gains nothing gains nothing).

Where the additive model fails the descent says so: when the left half of a group that
holds at least JOINT of the whole's gain gains less than JOINT of the group, the right
half is measured too (a measurement more on the dominant groups' path), and when the
halves gain less than JOINT of the group together the gain is joint (basic-pitch's CQT
front end: its 26 convolutions re-quantize one waveform octave after octave, and keeping
all of them in float takes the INT8 file from 0.90 to 0.99 while no one of them gains
0.001). Such a group is not split: it is returned as a unit, a candidate of its own, and
its members gain nothing alone.

The search (quant/sensitivity.py) then measures each candidate it keeps, on top of those
kept before, so an error of the additive model costs a trial, never a wrong file.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

MEASUREMENTS = 24  # re-quantized files measured for one ranking
JOINT = 0.5  # halves that gain less than this share of their group together: a unit
MIN_JOINT = 1e-3  # a group's gain below this (noise) is never a unit


@dataclass
class Group:
    """Consecutive segments (their indices in the ranked list) and the cosine keeping all of
    them in float gains."""

    first: int
    stop: int
    gain: float

    @property
    def size(self) -> int:
        return self.stop - self.first


def ranked_gains(segments: list[frozenset[str]], kept: frozenset[str], current: float,
                 score: Callable[[frozenset[str]], float],
                 measurements: int = MEASUREMENTS) -> tuple[list[float], list[Group]]:
    """(the cosine each of `segments` (op output tensors, in the file's op order) gains when
    kept in float on top of `kept`, the groups whose gain is joint: units): `score(float
    tensors)` measures a re-quantized file, `current` is the file's cosine with `kept`
    alone. Groups are split best first until `measurements` files were measured."""
    gains = [0.0] * len(segments)
    units: list[Group] = []
    if not segments:
        return gains, units
    used = 0

    def measured(first: int, stop: int) -> Group:
        nonlocal used
        used += 1
        tensors = kept.union(*segments[first:stop])
        return Group(first, stop, score(tensors) - current)

    whole = measured(0, len(segments))
    queue: list[tuple[float, int, Group]] = []  # (-gain, tie, group): the best group first
    tie = 0

    def settle(group: Group) -> None:
        nonlocal tie
        if group.size == 1 or group.gain <= 0:
            share = max(group.gain, 0.0) / group.size
            for k in range(group.first, group.stop):
                gains[k] = share
        else:
            tie += 1
            heapq.heappush(queue, (-group.gain, tie, group))
            share = group.gain / group.size  # until it is split
            for k in range(group.first, group.stop):
                gains[k] = share

    settle(whole)
    while queue and used < measurements:
        _, _, group = heapq.heappop(queue)
        middle = (group.first + group.stop) // 2
        left = measured(group.first, middle)
        if (left.gain >= JOINT * group.gain or group.gain < max(MIN_JOINT, JOINT * whole.gain)
                or used >= measurements):
            right = Group(middle, group.stop, group.gain - left.gain)  # additive: inferred
        else:
            right = measured(middle, group.stop)
            if left.gain + right.gain < JOINT * group.gain:
                units.append(group)
                for k in range(group.first, group.stop):
                    gains[k] = 0.0
                continue
        settle(left)
        settle(right)
    return gains, units
