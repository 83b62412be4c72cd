"""The .pyi stub and __all__ describe exactly what the compiled module and package export."""

import ast
import pathlib

import dlpart
import dlpart._core as core

STUB = pathlib.Path(dlpart.__file__).with_name("_core.pyi")
MAGIC_KEPT = {"__dlpack__", "__dlpack_device__", "__eq__", "__hash__", "__init__"}


def stub_names():
    tree = ast.parse(STUB.read_text())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        if isinstance(node, ast.AnnAssign):
            top.add(node.target.id)
    return top, members


def test_stub_matches_module():
    top, members = stub_names()
    module = {n for n in dir(core) if not n.startswith("__")} | {"__version__"}
    assert top - {"DeviceLike", "Splits", "LocationTuple"} == module
    for cls in ("Tensor", "Device", "_PartitionedArray"):
        real = {n for n in dir(getattr(core, cls)) if not n.startswith("__")}
        real |= {n for n in MAGIC_KEPT if n in vars(getattr(core, cls))}
        assert members[cls] - {"__init__", "__eq__", "__hash__"} == real - {"__init__", "__eq__", "__hash__"}, cls
    assert members["_testing"] == {n for n in dir(core._testing) if not n.startswith("_")}


def test_all_is_exact():
    public = {n for n in dir(dlpart) if not n.startswith("_") and n not in {"adapters"}}
    modules = {n for n in public if type(getattr(dlpart, n)).__name__ == "module"}
    assert set(dlpart.__all__) | {"__version__"} >= public - modules
    for name in dlpart.__all__:
        assert hasattr(dlpart, name), name
