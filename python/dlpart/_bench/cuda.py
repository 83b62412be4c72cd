"""The CUDA env: arrays and references through torch (preferred: dlpart's GPU targets are set
against torch's cat + split + contiguous and cudaMemcpy device-to-device) or cupy. Only
imported when a run asks for, or probes, kDLCUDA; every CUDA import lives here."""

from __future__ import annotations

import functools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .env import fill_host


def open_env(device_id: int) -> Tuple[Optional[object], str]:
    """A CudaEnv on `device_id` if an array library sees that GPU and dlpart's CUDA backend
    repartitions a small array there correctly; otherwise None and the reason."""
    import dlpart

    status = getattr(dlpart, "backend_status", None)
    if status is not None:
        reason = status(f"kDLCUDA:{device_id}")
        if reason is not None:
            return None, reason
    env, reasons, missing = None, [], 0
    for make in (_TorchEnv, _CupyEnv):
        try:
            env = make(device_id)
            break
        except ImportError:
            missing += 1
        except Exception as e:  # no driver, no such device
            reasons.append(f"{make.lib}: {type(e).__name__}: {e}")
    if env is None:
        if missing == 2:
            return None, "neither cupy nor torch is installed to allocate CUDA arrays"
        return None, "; ".join(reasons)
    if not hasattr(dlpart, "partition"):
        return None, "dlpart.partition is missing"
    try:
        x = env.filled((8, 6), "float32")
        r = dlpart.partition(x, (2, 1)).repartition(tiling=(1, 3))
        env.sync()
        for p in r.partitions.values():
            (r0, c0), (h, w) = p.start, p.shape
            if not env.equal(env.view(p.tensor), x[r0 : r0 + h, c0 : c0 + w]):
                return None, "dlpart's CUDA repartition gave a wrong result on a probe array"
    except Exception as e:
        return None, f"dlpart's CUDA backend is not usable: {type(e).__name__}: {e}"
    return env, ""


# HBM bandwidth by the vendors' datasheets, bytes/s, by a distinctive part of the name the
# driver reports. Longer keys are tried first ("H100 PCIe" before "H100").
DATASHEET_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,  # SXM5, reported as "NVIDIA H100 80GB HBM3"
    "GH200": 4.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,  # 40 GB parts
    "L40S": 0.864e12,
    "L4": 0.3e12,
}


def datasheet_bandwidth(gpu_name: str) -> Optional[float]:
    """The datasheet memory bandwidth of the GPU named `gpu_name` (bytes/s), or None when the
    name is not in `DATASHEET_BANDWIDTH`."""
    for key in sorted(DATASHEET_BANDWIDTH, key=len, reverse=True):
        if key in gpu_name:
            return DATASHEET_BANDWIDTH[key]
    return None


@functools.lru_cache(maxsize=None)
def _driver_version() -> Optional[str]:
    """The NVIDIA driver version from nvidia-smi, asked once per process."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None


class _CudaEnvBase:
    kind = "cuda"
    lib = ""
    memcpy_primary = ("memcpyD2D", "copy-kernel")

    def __init__(self, device_id: int) -> None:
        self.device = f"kDLCUDA:{device_id}"
        self.device_id = device_id
        self.direct = f"{self.lib}-direct"
        self.concat_split_name = f"{self.lib}-concat-split"
        self._scratch = None

    def datasheet(self) -> Optional[float]:
        """This GPU's datasheet memory bandwidth (bytes/s), or None if unknown."""
        return datasheet_bandwidth(str(self.info().get("gpu", "")))

    def close(self) -> None:
        pass

    def filled(self, shape: Sequence[int], dtype: str):
        return self.from_host(fill_host(shape, dtype))

    def clean_cache(self) -> None:
        """Leaves L2 holding clean lines only, by reading 128 MiB (over twice the L2 of the
        GPUs dlpart is measured on): see `CpuEnv.clean_cache`."""
        if self._scratch is None:
            self._scratch = self.from_host(np.ones(128 << 20, dtype=np.uint8))
        self._scratch.sum()
        self.sync()


class _CupyEnv(_CudaEnvBase):
    lib = "cupy"

    def __init__(self, device_id: int) -> None:
        import cupy as cp

        self.cp = cp
        cp.cuda.Device(device_id).use()
        cp.cuda.runtime.getDeviceProperties(device_id)
        super().__init__(device_id)
        # A plain copy kernel, 8 bytes per thread, as the second memcpy reference.
        self._copy64 = cp.ElementwiseKernel("T x", "T y", "y = x", "dlpart_bench_copy")

    def info(self) -> Dict[str, object]:
        props = self.cp.cuda.runtime.getDeviceProperties(self.device_id)
        return {
            "device": self.device,
            "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
            "gpu_memory": props["totalGlobalMem"],
            "array_library": f"cupy {self.cp.__version__}",
            "cuda_runtime": self.cp.cuda.runtime.runtimeGetVersion(),
            "driver": _driver_version() or self.cp.cuda.runtime.driverGetVersion(),
        }

    def empty(self, shape, dtype):
        return self.cp.empty(tuple(shape), dtype=dtype)

    def from_host(self, a):
        return self.cp.asarray(a)

    def to_host(self, a):
        return self.cp.asnumpy(a)

    def view(self, tensor):
        return self.cp.from_dlpack(tensor)

    def equal(self, a, b) -> bool:
        return bool(self.cp.array_equal(a, b))

    def sync(self) -> None:
        self.cp.cuda.Device(self.device_id).synchronize()

    def memcpy_refs(self, nbytes: int) -> Dict[str, Callable[[], object]]:
        cp = self.cp
        src = cp.ones(nbytes, dtype=cp.uint8)
        dst = cp.empty_like(src)
        words = nbytes // 8
        s64, d64 = src[: words * 8].view(cp.uint64), dst[: words * 8].view(cp.uint64)
        return {
            "memcpyD2D": lambda: dst.data.copy_from_device_async(src.data, nbytes),
            "copy-kernel": lambda: self._copy64(s64, d64),
        }

    def concat_split(self, parts: List, n: int, axis: int) -> List:
        cp = self.cp
        whole = cp.concatenate(parts, axis=1 - axis)
        return [cp.ascontiguousarray(p) for p in cp.array_split(whole, n, axis=axis)]

    def take(self, x, idx):
        return self.cp.take(x, idx)

    def take_out(self, x, idx, out):
        return self.cp.take(x, idx, out=out)

    def setitem(self, out, idx, values) -> None:
        out[idx] = values


class _TorchEnv(_CudaEnvBase):
    lib = "torch"

    def __init__(self, device_id: int) -> None:
        import torch

        if not torch.cuda.is_available() or device_id >= torch.cuda.device_count():
            raise RuntimeError(f"torch sees no CUDA device {device_id}")
        self.torch = torch
        self.dev = torch.device("cuda", device_id)
        super().__init__(device_id)

    def info(self) -> Dict[str, object]:
        p = self.torch.cuda.get_device_properties(self.dev)
        return {
            "device": self.device,
            "gpu": p.name,
            "gpu_memory": p.total_memory,
            "array_library": f"torch {self.torch.__version__}",
            "cuda_runtime": self.torch.version.cuda,
            "driver": _driver_version(),
        }

    def _dtype(self, dtype: str):
        return getattr(self.torch, np.dtype(dtype).name)

    def empty(self, shape, dtype):
        return self.torch.empty(tuple(shape), dtype=self._dtype(dtype), device=self.dev)

    def from_host(self, a):
        return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.dev)

    def to_host(self, a):
        return a.cpu().numpy()

    def view(self, tensor):
        return self.torch.from_dlpack(tensor)

    def equal(self, a, b) -> bool:
        return bool(self.torch.equal(a, b))

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.dev)

    def memcpy_refs(self, nbytes: int) -> Dict[str, Callable[[], object]]:
        t = self.torch
        src = t.ones(nbytes, dtype=t.uint8, device=self.dev)
        dst = t.empty_like(src)
        words = nbytes // 8
        s64, d64 = src[: words * 8].view(t.int64), dst[: words * 8].view(t.int64)
        # copy_ between contiguous same-dtype tensors is a cudaMemcpyAsync D2D; an add of zero
        # into `out` runs torch's elementwise kernel, which reads and writes the same bytes.
        return {
            "memcpyD2D": lambda: dst.copy_(src),
            "copy-kernel": lambda: t.add(s64, 0, out=d64),
        }

    def concat_split(self, parts: List, n: int, axis: int) -> List:
        whole = self.torch.cat(parts, dim=1 - axis)
        return [p.contiguous() for p in self.torch.tensor_split(whole, n, dim=axis)]

    def take(self, x, idx):
        return self.torch.index_select(x, 0, idx)

    def take_out(self, x, idx, out):
        return self.torch.index_select(x, 0, idx, out=out)

    def setitem(self, out, idx, values) -> None:
        out[idx] = values
