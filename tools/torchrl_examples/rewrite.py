"""Change a script's TorchRL loss imports to rlloss, as a user switching would:
``from torchrl.objectives[.<module>] import A, B`` keeps the names rlloss does not export
(``group_optimizers``...) on TorchRL and takes the others from ``rlloss``.

    python rewrite.py FILE...   # in place; prints each changed line
"""

import re
import sys

import rlloss

PATTERN = re.compile(r"^from (torchrl\.objectives(?:\.[\w.]+)?) import (.+)$")


def rewrite(line: str) -> str:
    match = PATTERN.match(line)
    if not match:
        return line
    module, names = match.group(1), [n.strip() for n in match.group(2).split(",")]
    ours = [n for n in names if n in rlloss.__all__]
    theirs = [n for n in names if n not in ours]
    lines = [f"from {module} import {', '.join(theirs)}"] if theirs else []
    lines += [f"from rlloss import {', '.join(ours)}"] if ours else []
    return "\n".join(lines)


for path in sys.argv[1:]:
    source = open(path).read().split("\n")
    changed = [rewrite(line) for line in source]
    for old, new in zip(source, changed, strict=True):
        if old != new:
            print(f"{path}: {old!r} -> {new!r}")
    open(path, "w").write("\n".join(changed))
