"""An independent reader of DLPack capsules through ctypes, to check what dlpart exports."""

import ctypes

pythonapi = ctypes.pythonapi
pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
pythonapi.PyCapsule_GetName.restype = ctypes.c_char_p
pythonapi.PyCapsule_GetName.argtypes = [ctypes.py_object]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


READ_ONLY = 1
IS_COPIED = 2


def read(capsule):
    """The capsule's name and a dict of its fields, without consuming it."""
    name = pythonapi.PyCapsule_GetName(capsule).decode()
    ptr = pythonapi.PyCapsule_GetPointer(capsule, name.encode())
    if name == "dltensor_versioned":
        m = DLManagedTensorVersioned.from_address(ptr)
        version, flags = (m.version.major, m.version.minor), m.flags
    else:
        m = DLManagedTensor.from_address(ptr)
        version, flags = None, 0
    t = m.dl_tensor
    return name, {
        "version": version,
        "flags": flags,
        "data": t.data or 0,
        "device": (t.device.device_type, t.device.device_id),
        "ndim": t.ndim,
        "dtype": (t.dtype.code, t.dtype.bits, t.dtype.lanes),
        "shape": tuple(t.shape[i] for i in range(t.ndim)) if t.shape else None,
        "strides": tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None,
        "byte_offset": t.byte_offset,
        "deleter": m.deleter,
    }
