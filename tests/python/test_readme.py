"""Every Python code block of the README runs as printed (its Rust blocks run as doc tests)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_block_runs(code):
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})


def test_the_readme_has_python_blocks():
    assert BLOCKS
