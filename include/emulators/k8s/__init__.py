"""An emulator of the Kubernetes API subset the reaper uses (``python -m include.emulators.k8s``)."""

from include.emulators.k8s.cluster import RESOURCE_OF_KIND, Cluster, K8sFaults
from include.emulators.k8s.server import K8sEmulator

__all__ = ["RESOURCE_OF_KIND", "Cluster", "K8sEmulator", "K8sFaults"]
