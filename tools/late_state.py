"""Run a SAC or TD3 MuJoCo tutorial and keep its end state, for ``update_drift.py --from-state``.

``tools/update_drift.py`` compares rlloss's and TorchRL's updates from one start on the same
batches; from a fresh start it sees early-training data only (random actions, short episodes).
This tool runs a tutorial unchanged and, when it ends, writes ``OUT/state.pt``: the loss
module's online and target parameters and temperature, the optimisers' Adam states, and
``--transitions`` transitions drawn from the final replay buffer as the tutorial draws its
batches (long episodes, 1,000-step truncations, saturated actions):

    python tools/late_state.py --transitions 20000 tutorials/sac_mujoco.py --env-id Hopper-v5 \\
        --seed 3 --total-frames 100000 --out runs/sac_hopper_late
    python tools/update_drift.py --from-state runs/sac_hopper_late/state.pt --dtype float64

Everything after the tutorial's path is the tutorial's own command line. The state is the
one-pass update's (SAC: one Adam over the critics, the policy and the temperature; TD3: the
critics' and the policy's), which is the update ``update_drift.py`` replays: ``--schedule
cleanrl`` is refused.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from swap_start import flag  # noqa: E402
from update_drift import state_of  # noqa: E402

OPTIMISERS = {  # per tutorial: its algorithm and its optimisers in update_drift's order
    "sac_mujoco.py": ("sac", ("optimizer",)),
    "td3_mujoco.py": ("td3", ("q_optimizer", "actor_optimizer")),
}


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This tool's flags, the tutorial and the tutorial's command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--transitions",
        type=int,
        default=20_000,
        help="how many transitions of the final replay buffer to keep",
    )
    parser.add_argument("tutorial", type=Path, help=f"one of {sorted(OPTIMISERS)}")
    args, tutorial_argv = parser.parse_known_args(argv)
    if args.tutorial.name not in OPTIMISERS:
        parser.error(f"{args.tutorial}: keeps the state of {sorted(OPTIMISERS)} only")
    if flag(tutorial_argv, "--out") is None:
        parser.error("give the tutorial an --out folder (state.pt is written there)")
    if flag(tutorial_argv, "--schedule", "one-pass") != "one-pass":
        parser.error(
            "--schedule cleanrl steps three optimisers; update_drift.py replays the "
            "one-pass update: run the tutorial without it"
        )
    if args.transitions < 256:
        parser.error(f"--transitions {args.transitions}: keep at least one batch (256)")
    return args, tutorial_argv


def main() -> None:
    args, tutorial_argv = parse(sys.argv[1:])
    tutorial = args.tutorial.resolve()
    algo, optimiser_names = OPTIMISERS[tutorial.name]
    sys.path.insert(0, str(tutorial.parent))  # the tutorial's `import _helpers`
    sys.argv = [str(tutorial), *tutorial_argv]
    run = runpy.run_path(str(tutorial), run_name="__main__")  # the tutorial's globals at its end
    update = (run["loss_module"], [run[name] for name in optimiser_names], None)
    transitions = run["buffer"].sample(batch_size=args.transitions)
    state = state_of(update, algo, run["args"].env_id, transitions)
    state["frames"] = run["args"].total_frames
    path = run["args"].out / "state.pt"
    torch.save(state, path)
    print(f"state={path}")


if __name__ == "__main__":
    main()
