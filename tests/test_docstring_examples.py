"""Every docstring example of the public API runs as written.

The API reference renders each docstring's ``Examples:`` section as code (``Example:``, singular,
renders as a note with its lines run together), so the examples are what a reader copies: each
one here is collected from a public name's docstring (``rlloss``, ``rlloss.functional``,
``rlloss.data``; a class's public methods and properties too) and executed in a fresh namespace,
with nothing supplied but what the example imports itself.
"""

from __future__ import annotations

import inspect
import re
import textwrap

import pytest
import torch

import rlloss

_SECTION = re.compile(r"^(?P<indent>[ \t]*)Examples?:[ \t]*$", re.M)


def _objects() -> dict[str, object]:
    """Every public name, and each public class's own public methods and properties."""
    found = {}
    for module in (rlloss, rlloss.functional, rlloss.data):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                continue
            found[f"{module.__name__}.{name}"] = obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if isinstance(member, property):
                        member = member.fget
                    if callable(member) and getattr(member, "__doc__", None):
                        found[f"{module.__name__}.{name}.{attr}"] = member
    return found


def examples(doc: str) -> list[str]:
    """The code of each ``Examples:`` section of a Google-style docstring (``>>>`` / ``...``)."""
    doc = inspect.cleandoc(doc)
    out = []
    for match in _SECTION.finditer(doc):
        indent = len(match.group("indent"))
        lines = []
        for line in doc[match.end() :].splitlines()[1:]:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break  # the next section
            lines.append(line)
        body = textwrap.dedent("\n".join(lines))
        code = [
            line[4:] if line[3:4] == " " else line[3:]
            for line in body.splitlines()
            if line.startswith((">>>", "..."))
        ]
        out.append("\n".join(code))
    return out


def _with_docs() -> dict[str, str]:
    return {name: inspect.getdoc(obj) or "" for name, obj in _objects().items()}


DOCS = _with_docs()
CASES = [
    pytest.param(code, id=f"{name}[{i}]" if i else name)
    for name, doc in sorted(DOCS.items())
    for i, code in enumerate(examples(doc))
]


def test_examples_are_under_examples_headings():
    singular = [name for name, doc in DOCS.items() if re.search(r"^\s*Example:\s*$", doc, re.M)]
    assert singular == [], f'"Example:" renders as a note, write "Examples:": {singular}'


def test_every_loss_and_estimator_has_an_example():
    missing = [
        name
        for name in rlloss.__all__
        if inspect.isclass(getattr(rlloss, name))
        and issubclass(getattr(rlloss, name), (rlloss.LossModule, rlloss.ValueEstimator))
        and getattr(rlloss, name) not in (rlloss.LossModule, rlloss.ValueEstimator)
        and not examples(DOCS[f"rlloss.{name}"])
    ]
    assert missing == []


def test_examples_were_collected():
    assert len(CASES) >= 60
    assert all(code.strip() for code in (case.values[0] for case in CASES))


# The extras an example may need (``pip install ".[llm]"``): without one, its examples skip.
OPTIONAL = {"transformers": "llm", "tokenizers": "llm"}


@pytest.mark.parametrize("code", CASES)
def test_docstring_example_runs(code):
    for module, extra in OPTIONAL.items():
        if re.search(rf"^(?:import|from) {module}\b", code, re.M):
            pytest.importorskip(module, reason=f'needs the {extra} extra: pip install ".[{extra}]"')
    torch.manual_seed(0)
    exec(compile(code, "<docstring example>", "exec"), {"__name__": "__docstring_example__"})
