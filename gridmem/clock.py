"""Time sources. Expiry runs on a monotonic clock; wall time only labels records.

`Clock` is the contract the store depends on. `SystemClock` reads the host;
`ManualClock` is paused until a test moves it, so boundaries such as
"alive at 29:59.999, expired at 30:00.000" are tested exactly, never slept for.
The boot id names the monotonic clock's domain: monotonic readings from
different boots cannot be compared (DESIGN section 4).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol
from typing import runtime_checkable

# A fixed default wall time keeps two ManualClock runs byte-identical.
DEFAULT_MANUAL_WALL_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")

# The store keeps one clock offset per boot id, for this many boots (the most
# recently seen; lua/lib.lua store_now). A boot id is at most MAX_BOOT_ID_CHARS
# of [A-Za-z0-9_.-] (lib.lua arg_clock). Both must agree with lib.lua.
MAX_CLOCK_BOOTS = 64
MAX_BOOT_ID_CHARS = 128


@runtime_checkable
class Clock(Protocol):
    """What the store needs to know about time."""

    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never goes backwards within one boot."""
        ...

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch; may jump in either direction."""
        ...

    def boot_id(self) -> str:
        """Identifies the monotonic clock's domain (one per host boot)."""
        ...


def _read_boot_id() -> str:
    try:
        return _BOOT_ID_FILE.read_text(encoding="ascii").strip()
    except OSError:
        # Not Linux: the boot time identifies the boot as well, to the second.
        import psutil

        return f"boot-{int(psutil.boot_time())}"


class SystemClock:
    """The host's clocks. The boot id is read once; it cannot change while we run."""

    def __init__(self) -> None:
        self._boot_id = _read_boot_id()

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def boot_id(self) -> str:
        return self._boot_id


class ManualClock:
    """A paused clock for tests and simulations: time moves only when told to."""

    def __init__(
        self,
        monotonic_ms: int = 0,
        wall_ms: int = DEFAULT_MANUAL_WALL_MS,
        boot_id: str = "manual",
    ) -> None:
        if monotonic_ms < 0:
            raise ValueError("monotonic_ms must be >= 0")
        self._mono = monotonic_ms
        self._wall = wall_ms
        self._boot_id = boot_id

    def monotonic_ms(self) -> int:
        return self._mono

    def wall_ms(self) -> int:
        return self._wall

    def boot_id(self) -> str:
        return self._boot_id

    def advance(self, ms: int) -> None:
        """Move both clocks forward by `ms` milliseconds."""
        if ms < 0:
            raise ValueError("advance() only moves forward; use set_wall() to move wall time back")
        self._mono += ms
        self._wall += ms

    def set_wall(self, ms: int) -> None:
        """Move the wall clock alone, in either direction (an NTP step, a wrong RTC)."""
        self._wall = ms

    def reboot(self, boot_id: str, monotonic_ms: int = 0) -> None:
        """Simulate a host reboot: a new monotonic domain starting at `monotonic_ms`."""
        self._boot_id = boot_id
        self._mono = monotonic_ms


class ScaledClock:
    """The host's clocks running `speed` times faster, the same in every process.

    For demos and tests of the service: with speed 120, thirty minutes of
    inactivity pass in fifteen seconds. Monotonic time is scaled from the host's
    monotonic zero and wall time from `wall_origin_ms`, so processes started at
    different moments agree. Its boot id names the scaled domain.
    """

    def __init__(self, speed: float, wall_origin_ms: int) -> None:
        if speed < 1:
            raise ValueError("speed must be at least 1")
        self.speed = speed
        self._wall_origin = wall_origin_ms
        self._boot_id = f"{_read_boot_id()}-x{speed:g}"

    def monotonic_ms(self) -> int:
        return int(time.monotonic_ns() * self.speed) // 1_000_000

    def wall_ms(self) -> int:
        real = time.time_ns() // 1_000_000
        return self._wall_origin + int((real - self._wall_origin) * self.speed)

    def boot_id(self) -> str:
        return self._boot_id


def make_clock(speed: float = 1, origin_ms: int | None = None) -> Clock:
    """The clock of `[worker] clock_speed` / `clock_origin_ms`: the host's own at speed
    1, else a ScaledClock (the same in every process that is given the same origin)."""
    if speed == 1:
        return SystemClock()
    return ScaledClock(speed, origin_ms if origin_ms is not None else 0)
