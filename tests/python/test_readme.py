"""Every Python code block of the README and of the user guide runs as printed (the README's
Rust blocks run as doc tests). The blocks of one document run in order, in one namespace, as
a reader would type them."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_python_blocks_run(path):
    found = blocks(path)
    assert found, f"{path.name} has no python block"
    namespace = {"__name__": "docs"}
    for i, code in enumerate(found):
        exec(compile(code, f"{path.name} block {i}", "exec"), namespace)
