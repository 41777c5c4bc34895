"""The README's example runs as written on a real rollout and lowers nothing to NaN."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from tensordict import TensorDict

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    example = re.search(r"## Example\s+```python\n(.*?)```", README.read_text(), re.S).group(1)
    num_envs, steps, obs = 4, 64, 3
    rollout = TensorDict(
        {
            "observation": torch.randn(num_envs, steps, obs),
            "action": torch.rand(num_envs, steps, 1) * 1.8 - 0.9,
            "action_log_prob": torch.zeros(num_envs, steps),
            "next": {
                "observation": torch.randn(num_envs, steps, obs),
                "reward": torch.randn(num_envs, steps, 1),
                "done": torch.zeros(num_envs, steps, 1, dtype=torch.bool),
                "terminated": torch.zeros(num_envs, steps, 1, dtype=torch.bool),
            },
        },
        [num_envs, steps],
    )
    namespace = {"rollout": rollout}
    exec(compile(example, str(README), "exec"), namespace)
    assert torch.isfinite(namespace["total"])
    assert "advantage" in namespace["rollout"].keys()
