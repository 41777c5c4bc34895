"""How far two TD3 updates drift apart from one start, on the same batches and draws.

The Results page's TD3 Hopper runs of rlloss and TorchRL differ by more than their seeds seem
to. This tool takes the MuJoCo tutorial's update (``TD3Loss``, Adam on the critics every step,
on the policy and the targets every second step, each library's ``SoftUpdate``) on Hopper-v5's
sizes, gives two loss modules the same parameters (TorchRL's draws copied into the other), and
trains both on the same batches of random transitions with the same target-smoothing draws:

    python tools/td3_drift.py                    # rlloss against TorchRL, float32
    python tools/td3_drift.py --dtype float64    # the same in float64
    python tools/td3_drift.py --against nudged   # TorchRL against itself, its critics'
                                                 # weights moved by one float32 rounding step

It prints the largest parameter difference every 500 updates. When the maths are the same, the
float64 differences stay at rounding level and the float32 differences grow as fast as a
one-step nudge of TorchRL's own weights does: float32 training runs of the two libraries part
the way two runs of one library with a different last bit do.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
import torchrl.objectives
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import MLP, ValueOperator

import rlloss

PARAMS = ("actor_network_params", "qvalue_network_params", "target_actor_network_params",
          "target_qvalue_network_params")


def random_transitions(env_id: str, count: int, seed: int) -> TensorDict:
    """``count`` transitions of uniformly random actions, in the tutorial's layout."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    rows = []
    for _ in range(count):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rows.append((obs, action, next_obs, [reward], [terminated], [terminated or truncated]))
        obs = env.reset()[0] if terminated or truncated else next_obs
    obs, action, next_obs, reward, terminated, done = (np.array(column) for column in zip(*rows, strict=True))
    floats = {"dtype": torch.get_default_dtype()}
    return TensorDict(
        observation=torch.as_tensor(obs, **floats), action=torch.as_tensor(action, **floats),
        next=TensorDict(observation=torch.as_tensor(next_obs, **floats),
                        reward=torch.as_tensor(reward, **floats),
                        terminated=torch.as_tensor(terminated), done=torch.as_tensor(done),
                        batch_size=[count]),
        batch_size=[count])


def td3_update(library, env: gym.Env) -> tuple:
    """The tutorial's TD3 loss, optimisers and target update, from ``library``."""
    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    policy = nn.Sequential(MLP(in_features=obs_dim, out_features=action_dim,
                               num_cells=[256, 256], activation_class=nn.ReLU), nn.Tanh())
    qvalue = ValueOperator(MLP(in_features=obs_dim + action_dim, out_features=1,
                               num_cells=[256, 256], activation_class=nn.ReLU),
                           in_keys=["observation", "action"])
    bound = torch.ones(action_dim)
    loss = library.TD3Loss(
        actor_network=TensorDictModule(policy, in_keys=["observation"], out_keys=["action"]),
        qvalue_network=qvalue, action_spec=Bounded(low=-bound, high=bound, shape=bound.shape),
        num_qvalue_nets=2, policy_noise=0.2, noise_clip=0.5, loss_function="l2")
    loss.make_value_estimator(torchrl.objectives.ValueEstimators.TD0, gamma=0.99)
    optimisers = [torch.optim.Adam(getattr(loss, name).flatten_keys().values(), lr=3e-4)
                  for name in ("qvalue_network_params", "actor_network_params")]
    return loss, optimisers, library.SoftUpdate(loss, tau=0.005)


def copy_parameters(source: nn.Module, target: nn.Module) -> None:
    """Every online and target parameter of ``source`` into ``target`` (the same keys)."""
    with torch.no_grad():
        for name in PARAMS:
            theirs, mine = getattr(source, name).flatten_keys(), getattr(target, name).flatten_keys()
            for key, value in theirs.items():
                mine[key].copy_(value)


def largest_difference(a: nn.Module, b: nn.Module, name: str) -> float:
    mine, theirs = getattr(a, name).flatten_keys(), getattr(b, name).flatten_keys()
    return max((mine[key] - value).abs().max().item() for key, value in theirs.items())


def step(update: tuple, batch: TensorDictBase, policy_step: bool) -> None:
    """One update of the tutorial: the critics, then the policy and targets if ``policy_step``."""
    loss_module, (q_optimizer, actor_optimizer), target_update = update
    losses = loss_module(batch.clone())
    q_optimizer.zero_grad()
    actor_optimizer.zero_grad()
    total = losses["loss_qvalue"] + losses["loss_actor"] if policy_step else losses["loss_qvalue"]
    total.backward()
    q_optimizer.step()
    if policy_step:
        actor_optimizer.step()
        target_update.step()


def drift(against: str, updates: int, env_id: str = "Hopper-v5", transitions: int = 20_000,
          every: int = 500) -> list[tuple[int, float, float]]:
    """Train TorchRL's update and ``against`` (``"rlloss"``, or ``"nudged"``: TorchRL's with its
    critics' weights moved by one rounding step) from one start, in the default dtype; every
    ``every`` updates, the largest |difference| of their critics' and their policies' weights."""
    torch.manual_seed(0)
    env = gym.make(env_id)
    reference = td3_update(torchrl.objectives, env)
    other = td3_update(rlloss if against == "rlloss" else torchrl.objectives, env)
    copy_parameters(reference[0], other[0])
    if against == "nudged":
        with torch.no_grad():
            for weight in other[0].qvalue_network_params.flatten_keys().values():
                weight.mul_(1 + torch.finfo(weight.dtype).eps * torch.randn_like(weight).sign())
    data = random_transitions(env_id, transitions, seed=0)
    sampler = torch.Generator().manual_seed(1)
    differences = []
    for update in range(1, updates + 1):
        batch = data[torch.randint(len(data), (256,), generator=sampler)]
        for module in (reference, other):
            torch.manual_seed(update)  # the same target-smoothing draws
            step(module, batch, policy_step=update % 2 == 0)
        if update % every == 0:
            differences.append((update, *(largest_difference(reference[0], other[0], name)
                                          for name in ("qvalue_network_params",
                                                       "actor_network_params"))))
    return differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", choices=["rlloss", "nudged"], default="rlloss")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--env-id", default="Hopper-v5")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(getattr(torch, args.dtype))
    print(f"{args.against} against TorchRL, {args.dtype}: largest |difference| of the parameters")
    for update, critics, policies in drift(args.against, args.updates, args.env_id):
        print(f"update {update}: critics {critics:.1e}, policies {policies:.1e}")


if __name__ == "__main__":
    main()
