"""A host with GPUs, as TensorFlow's device API shows it: the stand-in for the GPU path's tests
(this machine has no GPU and no NVIDIA driver).

`install` replaces only the functions of ``tf.config`` that list, pin and describe devices, in
the real ``tensorflow`` module, with ones that keep TensorFlow's rules:

* ``list_physical_devices("GPU")`` lists `tf.config.PhysicalDevice`s
  ``/physical_device:GPU:<i>``; ``list_physical_devices("CPU")`` the real CPU;
* ``set_visible_devices`` and ``set_memory_growth`` take only devices of that list, and only
  before the runtime starts (RuntimeError after, as TensorFlow raises);
* the visible GPUs are numbered anew: after ``set_visible_devices(gpus[2], "GPU")`` the one
  logical GPU is ``GPU:0``, and ``get_memory_info`` knows only logical GPUs (ValueError for
  another, as TensorFlow's "No matching devices");
* ``get_memory_info`` starts the runtime (it needs one).

The thread settings (``tf.config.threading``) stay TensorFlow's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Gpu:
    """One GPU of the host: what ``get_device_details`` says of it, its peak allocation."""

    details: dict[str, Any]
    peak_bytes: int


@dataclass
class GpuHost:
    gpus: list[Gpu]
    physical: list[Any] = field(default_factory=list)
    visible: list[Any] = field(default_factory=list)
    growth: set[str] = field(default_factory=set)
    started: bool = False
    real_list: Any = None  # TensorFlow's own list_physical_devices, for the CPU

    def _known(self, device: Any) -> int:
        if device not in self.physical:
            raise ValueError(f"Unrecognized device: {device!r}")
        return self.physical.index(device)

    def _before_start(self, what: str) -> None:
        if self.started:
            raise RuntimeError(f"{what} cannot be modified after being initialized")

    def list_physical_devices(self, device_type: str | None = None) -> list[Any]:
        if device_type == "GPU":
            return list(self.physical)
        return list(self.real_list(device_type))

    def set_visible_devices(self, devices: Any, device_type: str | None = None) -> None:
        self._before_start("Visible devices")
        chosen = devices if isinstance(devices, list) else [devices]
        for device in chosen:
            self._known(device)
        if device_type == "GPU":
            self.visible = chosen

    def get_visible_devices(self, device_type: str | None = None) -> list[Any]:
        assert device_type == "GPU", device_type
        return list(self.visible)

    def set_memory_growth(self, device: Any, enable: bool) -> None:
        self._before_start("Physical devices")
        self._known(device)
        (self.growth.add if enable else self.growth.discard)(device.name)

    def get_device_details(self, device: Any) -> dict[str, Any]:
        return dict(self.gpus[self._known(device)].details)

    def get_memory_info(self, device: str) -> dict[str, int]:
        self.started = True
        kind, _, index = device.partition(":")
        if kind != "GPU" or not index.isdigit() or int(index) >= len(self.visible):
            raise ValueError(f"No matching devices found for '{device}'")
        gpu = self.gpus[self._known(self.visible[int(index)])]
        return {"current": 0, "peak": gpu.peak_bytes}


def install(tf: Any, gpus: list[Gpu]) -> GpuHost:
    """Make `tf`'s device API show `gpus` (all visible, as at TensorFlow's start)."""
    real = tf.config.list_physical_devices
    if isinstance(getattr(real, "__self__", None), GpuHost):  # installed before
        real = real.__self__.real_list
    host = GpuHost(gpus, real_list=real)
    host.physical = [
        tf.config.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU")
        for i in range(len(gpus))
    ]
    host.visible = list(host.physical)
    tf.config.list_physical_devices = host.list_physical_devices
    tf.config.set_visible_devices = host.set_visible_devices
    tf.config.get_visible_devices = host.get_visible_devices
    tf.config.experimental.set_memory_growth = host.set_memory_growth
    tf.config.experimental.get_device_details = host.get_device_details
    tf.config.experimental.get_memory_info = host.get_memory_info
    return host
