"""The README works where it is read: its example runs as written, and its links resolve."""

from __future__ import annotations

import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_example_runs_as_written():
    """Exactly the README's code, nothing supplied: it builds its own rollout."""
    example = re.search(r"## Example\s+```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(example, str(README), "exec"), namespace)
    assert torch.isfinite(namespace["total"])
    assert "advantage" in namespace["rollout"].keys()


def _local_links(text: str) -> list[str]:
    inline = re.findall(r"\]\(([^)\s]+)\)", text)
    references = re.findall(r"^\[[^\]]+\]: (\S+)", text, re.M)
    return [
        link.split("#", 1)[0]
        for link in inline + references
        if not re.match(r"[a-z]+://", link) and not link.startswith(("#", "mailto:"))
    ]


def test_readme_links_resolve_in_the_repository():
    """Every local link of the README points to a file or folder checked in (the class links
    to the source file that defines the class: its docstring is also its API page)."""
    links = _local_links(README.read_text(encoding="utf-8"))
    assert len(links) > 50
    missing = [link for link in links if not (ROOT / link).exists()]
    assert missing == []


def test_readme_states_the_pins():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    readme = README.read_text(encoding="utf-8")
    for pin in re.findall(r'"((?:torch|tensordict|torchrl)[<>=][^"]+)"', pyproject):
        assert f"`{pin}`" in readme, pin
