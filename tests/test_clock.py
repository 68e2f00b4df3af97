"""ManualClock moves only when told to; SystemClock reads the host."""

from __future__ import annotations

import pytest

from gridmem import Clock
from gridmem import ManualClock
from gridmem import SystemClock


def test_manual_clock_starts_paused() -> None:
    clock = ManualClock(monotonic_ms=0, wall_ms=1_000, boot_id="manual")
    assert (clock.monotonic_ms(), clock.wall_ms(), clock.boot_id()) == (0, 1_000, "manual")
    clock.advance(250)
    assert (clock.monotonic_ms(), clock.wall_ms()) == (250, 1_250)
    clock.set_wall(10)  # wall alone, backwards
    assert (clock.monotonic_ms(), clock.wall_ms()) == (250, 10)
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)
    assert isinstance(clock, Clock)


def test_manual_clock_default_wall_is_fixed() -> None:
    assert ManualClock().wall_ms() == ManualClock().wall_ms()


def test_system_clock() -> None:
    clock = SystemClock()
    assert isinstance(clock, Clock)
    first = clock.monotonic_ms()
    assert clock.monotonic_ms() >= first
    assert clock.wall_ms() > 1_700_000_000_000
    assert clock.boot_id() and clock.boot_id() == SystemClock().boot_id()
