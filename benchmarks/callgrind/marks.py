"""The step scripts' side of ``run.sh``'s protocol: ask it to dump the counters."""

import os
import time


def mark(control: str, label: str) -> None:
    """Ask run.sh to dump the counters under ``label`` and wait until it has."""
    with open(f"{control}/req.tmp", "w") as f:
        f.write(label)
    os.rename(f"{control}/req.tmp", f"{control}/req")
    while os.path.exists(f"{control}/req"):
        time.sleep(0.05)
