"""How Ray puts GPU reservations on devices, so that a run whose pools cannot all be placed is refused, or
warned of, before a replica waits for ever.

Ray counts GPUs per device, not as one sum: a fractional reservation (num_gpus 0.6) takes part of one device
(the device it fits best, as the actors arrive), a whole one takes that many free devices. Three replicas of
0.6 GPU do not fit on two GPUs, although 1.8 <= 2; and 0.4, 0.4, 0.6, 0.6 fit on two only in some orders
(both 0.4 on one device first leaves 0.4 + 1.0 for the 0.6s: one waits). The arrival order is not the order
the actors were created in, so both questions are asked over every order."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

UNIT = 10_000  # Ray's resource precision: quantities are fixed-point at 1e-4 (its FixedPoint)
MAX_STATES = 200_000  # beyond this many (order, devices) states the order question is left unanswered


def _units(amount: float) -> int:
    return round(amount * UNIT)


def _take(devices: tuple[int, ...], demand: int) -> tuple[int, ...] | None:
    """The devices' free units after Ray places ``demand`` (units), or None where it cannot: a fraction on
    the device it leaves least free (its best fit), a whole number on that many wholly free devices."""
    free = list(devices)
    if demand >= UNIT:
        whole = [i for i, units in enumerate(free) if units == UNIT]
        if len(whole) < demand // UNIT:
            return None
        for i in whole[:demand // UNIT]:
            free[i] = 0
    else:
        fits = [i for i, units in enumerate(free) if units >= demand]
        if not fits:
            return None
        best = min(fits, key=lambda i: free[i])
        free[best] -= demand
    return tuple(sorted(free))


def orders(demands: Iterable[float], gpus: int) -> tuple[bool, bool | None]:
    """(some arrival order places every demand on ``gpus`` devices, some order leaves one waiting); the
    second is None where the orders are too many to go through."""
    counts = Counter(_units(d) for d in demands if d > 0)
    sizes = sorted(counts)
    seen: dict = {}

    def place(left: tuple[int, ...], devices: tuple[int, ...]) -> tuple[bool, bool]:
        if not any(left):
            return True, False
        key = (left, devices)
        if key in seen:
            return seen[key]
        if len(seen) >= MAX_STATES:
            raise OverflowError
        fits = waits = False
        for i, size in enumerate(sizes):
            if not left[i]:
                continue
            after = _take(devices, size)
            if after is None:
                waits = True
            else:
                some, stuck = place(left[:i] + (left[i] - 1,) + left[i + 1:], after)
                fits, waits = fits or some, waits or stuck
            if fits and waits:
                break
        seen[key] = fits, waits
        return fits, waits

    start = (tuple(counts[s] for s in sizes), (UNIT,) * gpus)
    try:
        return place(*start)
    except OverflowError:
        # too many orders to go through: whether any fits is still answered, by the largest first
        fits = _in_order(sorted((s for s in sizes for _ in range(counts[s])), reverse=True), gpus)
        return fits, None


def _in_order(demands: list[int], gpus: int) -> bool:
    devices: tuple[int, ...] | None = (UNIT,) * gpus
    for demand in demands:
        devices = _take(devices, demand)
        if devices is None:
            return False
    return True


def gpus_needed(demands: Iterable[float]) -> int:
    """The fewest devices on which Ray can place every demand (in the order that suits them best)."""
    demands = [d for d in demands if d > 0]
    gpus = math.ceil(sum(demands) - 1e-9)
    while not orders(demands, gpus)[0]:
        gpus += 1
    return gpus


def described(demands: Iterable[float]) -> str:
    """'3 x 0.6, 1 x 0.25' (largest first)."""
    counts = Counter(d for d in demands if d > 0)
    return ", ".join(f"{n} x {d:g}" for d, n in sorted(counts.items(), reverse=True))
