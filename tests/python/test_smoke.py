"""The extension builds and imports, and the package imported is this checkout's."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def pyproject_version() -> str:
    text = (REPO / "pyproject.toml").read_text()
    project = text[text.index("[project]") :]
    return re.search(r'^version\s*=\s*"([^"]+)"', project, re.MULTILINE).group(1)


def test_import_and_version():
    import dlpart
    import dlpart._core  # noqa: F401  (the compiled module itself, not only the package)

    assert dlpart.__version__ == pyproject_version()


def test_imported_package_matches_this_checkout():
    import dlpart

    # A stale install earlier on sys.path would make every other test meaningless. Compare
    # contents rather than paths so an installed wheel built from this checkout also passes.
    imported = Path(dlpart.__file__).read_text()
    assert imported == (REPO / "python" / "dlpart" / "__init__.py").read_text(), dlpart.__file__


def test_the_wheel_carries_the_cuda_backend():
    """A plain build has the CUDA backend compiled in: on a machine without a GPU,
    backend_status names what is missing here (the driver), not a missing build feature."""
    import os

    import dlpart

    status = dlpart.backend_status("kDLCUDA:0")
    if status is None:
        return  # a GPU and its driver are here
    assert "cuda` feature" not in status, status
    if not os.path.exists("/dev/nvidiactl"):
        assert "libcuda" in status or "driver" in status, status
