"""What the node's GPUs are, through NVML, behind an interface tests can feed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GpuInfo:
    """One device as NVML numbers it (the index CUDA_VISIBLE_DEVICES takes), memory in bytes."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int
    driver: str


class GpuProbe(Protocol):
    """Lists the GPUs; raises RuntimeError when the driver cannot be reached."""

    def gpus(self) -> list[GpuInfo]: ...


class NvmlProbe:
    """The real probe: nvidia-ml-py, imported only when a GPU run asks for it."""

    def gpus(self) -> list[GpuInfo]:
        try:
            import pynvml
        except ImportError as err:
            from regen.machine.extras import install_command

            command = install_command("nvidia", "nvidia-ml-py")
            hint = f"nvidia-ml-py is not installed: make nvidia in the checkout, or {command}"
            raise RuntimeError(hint) from err
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise RuntimeError(f"NVML: {err}") from err
        try:
            driver = _text(pynvml.nvmlSystemGetDriverVersion())
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                name = _text(pynvml.nvmlDeviceGetName(handle))
                out.append(GpuInfo(i, name, int(mem.total), int(mem.free), driver))
            return out
        except pynvml.NVMLError as err:
            raise RuntimeError(f"NVML: {err}") from err
        finally:
            pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    # nvidia-ml-py before 11.5 returns bytes; str(b"...") would print "b'NVIDIA B200'".
    return value.decode() if isinstance(value, bytes) else str(value)
