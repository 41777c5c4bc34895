"""Run a SAC or TD3 MuJoCo tutorial with one library's loss from the other library's start.

With one ``--seed``, a run with rlloss's losses and one with TorchRL's start from different
critics (each library draws an ensemble's members its own way: Differences from TorchRL, "The
off-policy losses") and so go on with different random streams: a seed of one library is not the
same experiment as that seed of the other. This tool runs a tutorial with ``--losses L`` but
first builds the other library's loss module as that library's own run would (same networks,
same random draws), copies its initial parameters (critics, policy, their targets, the
temperature) into L's module and leaves torch's random stream where the other library's
construction left it. The run is then the other library's run of that seed, with L's loss doing
the updates, until float32 rounding makes the two part. Its ``OUT/summary.json`` records
``"variant": "<other library>'s start"`` (a row of its own on the Results page):

    python tools/swap_start.py tutorials/td3_mujoco.py --env-id Hopper-v5 --losses rlloss \\
        --seed 0 --out runs/td3_hopper_rlloss_from_torchrl_s0

Everything after the tutorial's path is the tutorial's own command line.
"""

from __future__ import annotations

import copy
import json
import runpy
import sys
from pathlib import Path

import torch
import torchrl.objectives

import rlloss

sys.path.insert(0, str(Path(__file__).resolve().parent))
from update_drift import PARAMS, copy_parameters  # noqa: E402

LIBRARIES = {"rlloss": rlloss, "torchrl": torchrl.objectives}
LOSSES = {"SACLoss": "sac", "TD3Loss": "td3"}  # class: update_drift's parameter table


def from_start_of(own: type, other: type, names: tuple[str, ...]):
    """A stand-in for ``own``'s constructor: builds ``other`` on copies of the same arguments
    first (drawing what ``other`` draws), then ``own``; gives ``own`` ``other``'s parameters
    ``names`` and torch's random state as ``other`` left it."""

    def build(*args, **kwargs):
        other_module = other(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        random_state = torch.get_rng_state()
        own_module = own(*args, **kwargs)
        copy_parameters(other_module, own_module, names)
        torch.set_rng_state(random_state)
        return own_module

    return build


def flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    """The value of ``--name`` in a tutorial's command line, as argparse reads it."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return default


def other_name(own_name: str) -> str:
    (other,) = set(LIBRARIES) - {own_name}
    return other


def patch(own_name: str) -> None:
    """Replaces ``SACLoss`` and ``TD3Loss`` in library ``own_name`` by stand-ins that start from
    the other library's draws."""
    own, other = LIBRARIES[own_name], LIBRARIES[other_name(own_name)]
    for class_name, algo in LOSSES.items():
        setattr(
            own,
            class_name,
            from_start_of(getattr(own, class_name), getattr(other, class_name), PARAMS[algo]),
        )


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__)
    tutorial, tutorial_argv = Path(sys.argv[1]).resolve(), sys.argv[2:]
    out, own_name = flag(tutorial_argv, "--out"), flag(tutorial_argv, "--losses", "rlloss")
    if out is None:
        sys.exit("swap_start.py: give the tutorial an --out folder (its summary is marked there)")
    if own_name not in LIBRARIES:
        sys.exit(f"swap_start.py: --losses {own_name!r}: choose one of {sorted(LIBRARIES)}")
    patch(own_name)
    sys.path.insert(0, str(tutorial.parent))  # the tutorial's `import _helpers`
    sys.argv = [str(tutorial), *tutorial_argv]
    runpy.run_path(str(tutorial), run_name="__main__")
    summary_path = Path(out) / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["variant"] = f"{other_name(own_name)}'s start"
    summary_path.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
