"""The thermal guard: warn about a hot GPU and, when asked to, pause training until it cools.

Each rank runs its own guard on its own GPU at the report points (the loop calls
`guard.check(reading)` with a `GpuMonitor` reading). A pause on one rank makes the others wait at
the next collective, so a pause is capped at THERMAL_MAX_PAUSE_S, well inside NCCL's default
10-minute collective timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

THERMAL_HYSTERESIS_C = 5  # the guard resumes below limit - 5 C, so it does not flap at the limit
THERMAL_POLL_S = 10.0
THERMAL_MAX_PAUSE_S = 300.0  # stay well inside NCCL's default 10 min collective timeout


class ThermalGuard:
    """Warns when a reading is above the limit; when enabled, also pauses until it cools.

    Args:
        limit_c: train.thermal_limit_c.
        enabled: train.thermal_guard; off, a hot GPU only gets the warning.
        read_temp: returns the current GPU temperature in C, or None (e.g. GpuMonitor.temperature).
        sleep: waits that many seconds (tests pass a recorder).
        say: writes a line (the pause progress), e.g. Telemetry.message.
        warn: writes a warning `warn(code, text, **fields)`, e.g. Telemetry.warn (which rate-limits
            it and records it in metrics.jsonl); default: `say("WARNING " + text)`.
    """

    def __init__(self, limit_c: float, enabled: bool, read_temp: Callable[[], float | None], *,
                 sleep: Callable[[float], None] = time.sleep, say: Callable[[str], None] = print,
                 warn: Callable[..., None] | None = None):
        self.limit_c = limit_c
        self.enabled = enabled
        self.read_temp = read_temp
        self.sleep = sleep
        self.say = say
        self.warn = warn if warn is not None else (lambda code, text, **fields: say(f"WARNING {text}"))

    @property
    def resume_c(self) -> float:
        return self.limit_c - THERMAL_HYSTERESIS_C

    def check(self, reading: dict) -> float:
        """Act on one GPU reading (keys temp_c, clock_reasons, power_limit_w, all optional).

        Returns the seconds spent paused (0 when cool, unreadable, or the guard is off).
        """
        temp = reading.get("temp_c")
        if temp is None or temp <= self.limit_c:
            return 0.0
        self.warn("thermal", self._advice(temp, reading), temp_c=temp)
        return self._pause_until_cool(temp) if self.enabled else 0.0

    def _advice(self, temp: float, reading: dict) -> str:
        reasons = reading.get("clock_reasons") or []
        held = f" (clocks held back by: {', '.join(reasons)})" if reasons else ""
        power = ""
        if reading.get("power_limit_w"):
            power = f", or lower the power limit (e.g. `sudo nvidia-smi -pl {0.8 * reading['power_limit_w']:.0f}`)"
        if self.enabled:
            action = f"the thermal guard pauses training until it cools below {self.resume_c} C"
        else:
            action = f"set train.thermal_guard: true to pause until it cools below {self.resume_c} C"
        return (f"GPU at {temp} C, above train.thermal_limit_c {self.limit_c} C{held}; "
                f"check airflow and fans{power}; {action}")

    def _pause_until_cool(self, temp: float | None) -> float:
        paused = 0.0
        while temp is not None and temp >= self.resume_c and paused < THERMAL_MAX_PAUSE_S:
            self.say(f"thermal guard: GPU at {temp} C, paused {paused:.0f}s, waiting for < {self.resume_c} C")
            self.sleep(THERMAL_POLL_S)
            paused += THERMAL_POLL_S
            temp = self.read_temp()
        state = f"GPU at {temp} C" if temp is not None else "temperature unreadable"
        self.say(f"thermal guard: resuming after {paused:.0f}s ({state})")
        return paused
