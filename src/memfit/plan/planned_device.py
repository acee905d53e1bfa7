"""The device a plan is for, by the name ``--device`` gives, and the profile its step times
come from: this machine's (a file MEMFIT_DEVICE_PROFILE names, else its calibration, made on
first use and cached: calibrate.py) or a builtin GPU's (devices.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from memfit._utils.errors import ConfigError
from memfit.plan.calibrate import calibrate_and_cache
from memfit.plan.devices import (
    ASSUMED_GPU,
    BUILTIN,
    PROFILE_ENV,
    PROFILE_VERSION,
    DeviceProfile,
    builtin,
    cache_path,
    read_cached,
)


@dataclass(frozen=True)
class PlannedDevice:
    """What ``--device`` names: the kind of device the bytes are planned for, the profile
    its step times come from, and the line to show when it was just calibrated."""

    kind: str  # "cuda" (CUDA context and allocator slack counted) or "cpu"
    profile: DeviceProfile
    calibrated: str | None = None  # "calibrated this machine's cpu once (5 s): PATH"

    @property
    def label(self) -> str:
        return self.profile.name


def planned_device(device: str) -> PlannedDevice:
    """``cuda`` / ``cpu`` (this machine's: the file MEMFIT_DEVICE_PROFILE names, else its
    calibration, made on first use and cached) or a builtin GPU's name; ``cuda`` where no
    GPU is here takes ``ASSUMED_GPU``'s builtin profile."""
    if device == "cpu" or (device == "cuda" and torch.cuda.is_available()):
        given = os.environ.get(PROFILE_ENV)
        if given:
            if not Path(given).is_file():
                raise ConfigError(f"{PROFILE_ENV}={given}: no such file; unset it to "
                                  "calibrate this machine")
            profile = read_cached(Path(given), device)
            if profile is None:
                raise ConfigError(f"{PROFILE_ENV}={given} is a profile of another memfit "
                                  f"version (not {PROFILE_VERSION}); calibrate again with "
                                  "`memfit env --calibrate`")
            return PlannedDevice(device, profile)
        cached = read_cached(cache_path(device), device)
        if cached is not None:
            return PlannedDevice(device, cached)
        profile, path, took = calibrate_and_cache(device)
        return PlannedDevice(device, profile, f"calibrated this machine's {profile.name} once "
                                              f"for step times ({took:.0f} s), kept in {path}")
    if device == "cuda":
        return PlannedDevice("cuda", BUILTIN[ASSUMED_GPU])
    return PlannedDevice("cuda", builtin(device))
