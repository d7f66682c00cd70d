"""The few NVML readings the power probes need, through ctypes (no pynvml on the GPU machine).

``Nvml(index)`` opens one device; its methods read the card's energy counter (mJ since
the driver loaded), its SM clock, its power draw (the driver's one-second average) and
the clock event reasons now active (bit 0x4: the software power cap). Reading only:
nothing here changes a setting of the card.
"""

from __future__ import annotations

import ctypes

SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
_CLOCK_SM = 1  # nvmlClockType_t NVML_CLOCK_SM


class Nvml:
    """One device's readings; raises ``OSError`` where libnvidia-ml cannot be loaded and
    ``RuntimeError`` where a call fails."""

    def __init__(self, index: int = 0) -> None:
        self._lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._call("nvmlInit_v2")
        self._handle = ctypes.c_void_p()
        handle = ctypes.byref(self._handle)
        self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), handle)

    def _call(self, name: str, *args: object) -> None:
        status = getattr(self._lib, name)(*args)
        if status != 0:
            raise RuntimeError(f"{name} returned NVML status {status}")

    def _read(self, name: str, ctype: type, *args: object) -> int:
        value = ctype()
        self._call(name, self._handle, *args, ctypes.byref(value))
        return int(value.value)

    def energy_mj(self) -> int:
        """Millijoules the card has used since the driver loaded."""
        return self._read("nvmlDeviceGetTotalEnergyConsumption", ctypes.c_ulonglong)

    def sm_mhz(self) -> int:
        return self._read("nvmlDeviceGetClockInfo", ctypes.c_uint, ctypes.c_int(_CLOCK_SM))

    def power_w(self) -> float:
        """The driver's averaged power draw."""
        return self._read("nvmlDeviceGetPowerUsage", ctypes.c_uint) / 1e3

    def event_reasons(self) -> int:
        """Bit mask of the clock event reasons active now (``SW_POWER_CAP``, ...)."""
        return self._read("nvmlDeviceGetCurrentClocksThrottleReasons", ctypes.c_ulonglong)
