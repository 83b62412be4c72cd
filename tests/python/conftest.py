import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def aligned_empty(shape, dtype, align=64):
    """A numpy array whose data starts on an `align`-byte boundary (JAX imports only those
    zero-copy)."""
    import numpy as np

    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    buf = np.empty(n + align, dtype=np.uint8)
    off = (-buf.ctypes.data) % align
    return buf[off : off + n].view(dtype).reshape(shape)


def import_or_skip(name, reason=None):
    return pytest.importorskip(name, reason=reason or f"{name} is not installed")
