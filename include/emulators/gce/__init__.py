"""An emulator of the Compute Engine v1 REST API subset the reaper uses (``python -m include.emulators.gce``)."""

from include.emulators.gce.fleet import Fleet, GceFaults
from include.emulators.gce.server import Emulator

__all__ = ["Emulator", "Fleet", "GceFaults"]
