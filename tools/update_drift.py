"""How far two TD3 or SAC updates drift apart from one start, on the same batches and draws.

The Results page's Hopper runs of rlloss and TorchRL differ by more than their seeds seem to.
This tool takes a MuJoCo tutorial's update on Hopper-v5's sizes (``--algo td3``: ``TD3Loss``,
Adam on the critics every step, on the policy and the targets every second step; ``--algo
sac``: ``SACLoss``, one Adam over the critics, the policy and the temperature, and the target
update, every step; each library's ``SoftUpdate``), gives two loss modules the same parameters
(TorchRL's draws copied into the other), and trains both on the same batches of random
transitions with the same random draws (target smoothing, the policy's samples):

    python tools/update_drift.py                    # TD3: rlloss against TorchRL, float32
    python tools/update_drift.py --dtype float64    # the same in float64
    python tools/update_drift.py --against nudged   # TorchRL against itself, its critics'
                                                    # weights moved by one float32 rounding step
    python tools/update_drift.py --algo sac         # the same for SAC
    python tools/update_drift.py --from-state runs/sac_hopper_late/state.pt
                                                    # from a tutorial run's end state
                                                    # (tools/late_state.py), on its replay data

It prints the largest parameter difference every 500 updates. When the maths are the same, the
float64 differences stay at rounding level and the float32 differences grow as fast as a
one-step nudge of TorchRL's own weights does: float32 training runs of the two libraries part
the way two runs of one library with a different last bit do. ``--from-state`` makes the same
comparison from late in a run (trained networks, Adam's moments, long episodes, truncations,
saturated actions), where a fresh start on random-action data does not reach.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torchrl.objectives
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Bounded
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator

import rlloss

PARAMS = {  # per algorithm: the online and target parameters the two loss modules share
    "td3": (
        "actor_network_params",
        "qvalue_network_params",
        "target_actor_network_params",
        "target_qvalue_network_params",
    ),
    "sac": (
        "actor_network_params",
        "qvalue_network_params",
        "target_qvalue_network_params",
        "log_alpha",
    ),
}


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
    obs, action, next_obs, reward, terminated, done = (
        np.array(column) for column in zip(*rows, strict=True)
    )
    floats = {"dtype": torch.get_default_dtype()}
    return TensorDict(
        observation=torch.as_tensor(obs, **floats),
        action=torch.as_tensor(action, **floats),
        next=TensorDict(
            observation=torch.as_tensor(next_obs, **floats),
            reward=torch.as_tensor(reward, **floats),
            terminated=torch.as_tensor(terminated),
            done=torch.as_tensor(done),
            batch_size=[count],
        ),
        batch_size=[count],
    )


def relu_mlp(in_features: int, out_features: int) -> MLP:
    """The tutorials' 256-256 ReLU network."""
    return MLP(
        in_features=in_features,
        out_features=out_features,
        num_cells=[256, 256],
        activation_class=nn.ReLU,
    )


def critic(env: gym.Env) -> ValueOperator:
    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    return ValueOperator(relu_mlp(obs_dim + action_dim, 1), in_keys=["observation", "action"])


def action_spec(env: gym.Env) -> Bounded:
    bound = torch.ones(env.action_space.shape[0])  # Hopper's and HalfCheetah's: [-1, 1]
    return Bounded(low=-bound, high=bound, shape=bound.shape)


class ScaledTanhPolicy(nn.Module):
    """The TD3 tutorial's policy network (the same parameter and buffer names):
    mu(s) = scale * tanh(MLP(s)) + bias."""

    def __init__(self, obs_dim: int, spec: Bounded) -> None:
        super().__init__()
        low, high = spec.space.low, spec.space.high
        self.net = relu_mlp(obs_dim, low.numel())
        self.register_buffer("scale", (high - low) / 2)
        self.register_buffer("bias", (high + low) / 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.scale * torch.tanh(self.net(observation)) + self.bias


def td3_update(library, env: gym.Env) -> tuple:
    """The TD3 tutorial's loss, optimisers (critics, policy) and target update, from ``library``."""
    policy = ScaledTanhPolicy(env.observation_space.shape[0], action_spec(env))
    loss = library.TD3Loss(
        actor_network=TensorDictModule(policy, in_keys=["observation"], out_keys=["action"]),
        qvalue_network=critic(env),
        action_spec=action_spec(env),
        num_qvalue_nets=2,
        policy_noise=0.2,
        noise_clip=0.5,
        loss_function="l2",
    )
    loss.make_value_estimator(torchrl.objectives.ValueEstimators.TD0, gamma=0.99)
    optimisers = [
        torch.optim.Adam(getattr(loss, name).flatten_keys().values(), lr=3e-4)
        for name in ("qvalue_network_params", "actor_network_params")
    ]
    return loss, optimisers, library.SoftUpdate(loss, tau=0.005)


class GaussianHead(nn.Module):
    """The SAC tutorial's policy network: the pre-tanh Gaussian's mean and standard deviation,
    log sigma squashed into [-5, 2]."""

    def __init__(self, obs_dim: int, action_dim: int) -> None:
        super().__init__()
        self.net = relu_mlp(obs_dim, 2 * action_dim)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, raw_log_std = self.net(observation).chunk(2, dim=-1)
        return loc, (-5.0 + 3.5 * (torch.tanh(raw_log_std) + 1)).exp()


def sac_update(library, env: gym.Env) -> tuple:
    """The SAC tutorial's loss, its one Adam (critics and temperature 1e-3, policy 3e-4) and
    target update, from ``library``."""
    spec = action_spec(env)
    head = GaussianHead(env.observation_space.shape[0], env.action_space.shape[0])
    actor = ProbabilisticActor(
        TensorDictModule(head, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
    )
    loss = library.SACLoss(
        actor_network=actor,
        qvalue_network=critic(env),
        num_qvalue_nets=2,
        loss_function="l2",
        alpha_init=1.0,
        action_spec=spec,
        target_entropy="auto",
    )
    loss.make_value_estimator(torchrl.objectives.ValueEstimators.TD0, gamma=0.99)
    optimiser = torch.optim.Adam(
        [
            {"params": list(loss.qvalue_network_params.flatten_keys().values()), "lr": 1e-3},
            {"params": list(loss.actor_network_params.flatten_keys().values()), "lr": 3e-4},
            {"params": [loss.log_alpha], "lr": 1e-3},
        ]
    )
    return loss, [optimiser], library.SoftUpdate(loss, tau=0.005)


BUILDERS = {"td3": td3_update, "sac": sac_update}


def tensors(module: nn.Module, name: str) -> dict:
    """The tensors of ``module.<name>`` by key (a parameter table, or one tensor)."""
    value = getattr(module, name)
    return dict(value.flatten_keys().items()) if isinstance(value, TensorDictBase) else {"": value}


def copy_parameters(source: nn.Module, target: nn.Module, names: tuple[str, ...]) -> None:
    """Every tensor ``names`` of ``source`` into ``target`` (the same keys)."""
    copy_tensors({name: tensors(source, name) for name in names}, target)


def copy_tensors(saved: dict, target: nn.Module) -> None:
    """``saved`` (``{name: {key: tensor}}``) into ``target``'s tensors of the same names and
    keys, cast to their dtype."""
    with torch.no_grad():
        for name, values in saved.items():
            mine = tensors(target, name)
            for key, value in values.items():
                mine[key].copy_(value)


def largest_difference(a: nn.Module, b: nn.Module, name: str) -> float:
    mine = tensors(a, name)
    return max((mine[key] - value).abs().max().item() for key, value in tensors(b, name).items())


def step(update: tuple, batch: TensorDictBase, policy_step: bool) -> None:
    """One update of the tutorial: the critics (TD3's first optimiser), then, if
    ``policy_step``, every loss, optimiser and the targets (SAC: every step)."""
    loss_module, optimisers, target_update = update
    losses = loss_module(batch.clone())
    for optimiser in optimisers:
        optimiser.zero_grad()
    keys = [
        key
        for key in ("loss_qvalue", "loss_actor", "loss_alpha")
        if key in losses.keys() and (policy_step or key == "loss_qvalue")
    ]
    sum(losses[key] for key in keys).backward()
    for optimiser in optimisers if policy_step else optimisers[:1]:
        optimiser.step()
    if policy_step:
        target_update.step()


TRANSITION_KEYS = (
    "observation",
    "action",
    "next.observation",
    "next.reward",
    "next.terminated",
    "next.done",
)


def state_of(update: tuple, algo: str, env_id: str, transitions: TensorDictBase) -> dict:
    """What ``--from-state`` starts from: the parameters and optimiser states of a tutorial's
    ``update`` (its loss module, its optimisers in the builder's order), its task, and the
    transitions to train on; plain tensors and dicts (``torch.load(weights_only=True)``)."""
    return {
        "algo": algo,
        "env_id": env_id,
        "parameters": {
            name: {key: value.detach().clone() for key, value in tensors(update[0], name).items()}
            for name in PARAMS[algo]
        },
        "optimisers": optimiser_states(update, algo),
        "transitions": {
            key: value.clone()
            for key, value in transitions.flatten_keys(".").items()
            if key in TRANSITION_KEYS
        },
    }


def parameters_by_name(update: tuple, algo: str) -> dict:
    """Each optimiser's parameters by their name in the loss module (``<table>.<key>``): the
    two libraries may order a table's tensors differently."""
    loss_module, optimisers, _ = update
    names = {
        id(value): f"{name}.{key}"
        for name in PARAMS[algo]
        for key, value in tensors(loss_module, name).items()
    }
    return [
        {names[id(p)]: p for group in optimiser.param_groups for p in group["params"]}
        for optimiser in optimisers
    ]


def optimiser_states(update: tuple, algo: str) -> list[dict]:
    """Copies of each optimiser's per-parameter state (Adam's step and moments), by name."""
    return [
        {
            name: copy.deepcopy(optimiser.state[p])
            for name, p in named.items()
            if p in optimiser.state
        }
        for optimiser, named in zip(update[1], parameters_by_name(update, algo), strict=True)
    ]


def set_optimiser_states(update: tuple, algo: str, states: list[dict]) -> None:
    """Gives ``update``'s optimisers copies of ``states`` (``optimiser_states``), the moments
    cast to each parameter's dtype."""
    for optimiser, named, saved in zip(
        update[1], parameters_by_name(update, algo), states, strict=True
    ):
        optimiser.state.clear()
        for name, entry in saved.items():
            p = named[name]
            optimiser.state[p] = {
                key: value.to(p.dtype).clone() if value.shape == p.shape else value.clone()
                for key, value in entry.items()
            }


def load_state(update: tuple, state: dict) -> TensorDict:
    """Gives ``update`` the parameters and optimiser states of ``state`` (cast to its dtype);
    returns the state's transitions in the default dtype."""
    copy_tensors(state["parameters"], update[0])
    set_optimiser_states(update, state["algo"], state["optimisers"])
    floats = torch.get_default_dtype()
    return TensorDict(
        {
            key: value.to(floats) if value.is_floating_point() else value
            for key, value in state["transitions"].items()
        },
        batch_size=[len(state["transitions"]["observation"])],
    ).unflatten_keys(".")


def drift(
    against: str,
    updates: int,
    algo: str = "td3",
    env_id: str = "Hopper-v5",
    transitions: int = 20_000,
    every: int = 500,
    state: dict | None = None,
) -> list[tuple[int, float, float]]:
    """Train TorchRL's ``algo`` update and ``against`` (``"rlloss"``, or ``"nudged"``: TorchRL's
    with its critics' weights moved by one rounding step) from one start, in the default dtype;
    every ``every`` updates, the largest |difference| of their critics' and policies' weights.
    The start is a fresh draw, trained on ``transitions`` random-action transitions of
    ``env_id``, or ``state`` (``state_of``: a tutorial's late parameters, Adam states and
    replay data; it names the algorithm and the task)."""
    if state is not None:
        algo, env_id = state["algo"], state["env_id"]
    torch.manual_seed(0)
    env = gym.make(env_id)
    reference = BUILDERS[algo](torchrl.objectives, env)
    other = BUILDERS[algo](rlloss if against == "rlloss" else torchrl.objectives, env)
    if state is None:
        data = random_transitions(env_id, transitions, seed=0)
    else:
        data = load_state(reference, state)
    copy_parameters(reference[0], other[0], PARAMS[algo])
    set_optimiser_states(other, algo, optimiser_states(reference, algo))
    if against == "nudged":
        with torch.no_grad():
            for weight in other[0].qvalue_network_params.flatten_keys().values():
                weight.mul_(1 + torch.finfo(weight.dtype).eps * torch.randn_like(weight).sign())
    sampler = torch.Generator().manual_seed(1)
    differences = []
    for update in range(1, updates + 1):
        batch = data[torch.randint(len(data), (256,), generator=sampler)]
        for module in (reference, other):
            torch.manual_seed(update)  # the same random draws
            step(module, batch, policy_step=algo == "sac" or update % 2 == 0)
        if update % every == 0:
            differences.append(
                (
                    update,
                    *(
                        largest_difference(reference[0], other[0], name)
                        for name in ("qvalue_network_params", "actor_network_params")
                    ),
                )
            )
    return differences


def init_law(algo: str, seeds: range, env_id: str = "Hopper-v5") -> dict:
    """Per library, critic member and tensor of the critics as each library's loss draws them
    from one network: the standard deviation and the largest |value|, averaged over ``seeds``."""
    env = gym.make(env_id)
    draws = {}  # (library, member, key): [(std, largest |value|) per seed]
    for name, library in (("torchrl", torchrl.objectives), ("rlloss", rlloss)):
        for seed in seeds:
            torch.manual_seed(seed)
            critics = BUILDERS[algo](library, env)[0].qvalue_network_params.flatten_keys()
            for key, value in critics.items():
                for member, tensor in enumerate(value):
                    spread = tensor.std().item() if tensor.numel() > 1 else 0.0
                    draws.setdefault((name, member, key), []).append(
                        (spread, tensor.abs().max().item())
                    )
    return {
        k: tuple(sum(column) / len(v) for column in zip(*v, strict=True)) for k, v in draws.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", choices=list(BUILDERS), default="td3")
    parser.add_argument("--against", choices=["rlloss", "nudged"], default="rlloss")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--every", type=int, default=500, help="print every this many updates")
    parser.add_argument("--env-id", default="Hopper-v5")
    parser.add_argument(
        "--from-state",
        type=Path,
        help="start from a tutorial's end state (tools/late_state.py's OUT/state.pt: its "
        "parameters, Adam states and replay data; it sets --algo and --env-id)",
    )
    parser.add_argument(
        "--init-law",
        action="store_true",
        help="instead: the critics' initial draws of both libraries, seeds 0-4",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.init_law:
        for (library, member, key), (spread, largest) in init_law(args.algo, range(5)).items():
            print(f"{library:8} critic {member} {key:16}: std {spread:.4f}, largest {largest:.4f}")
        return
    state = None if args.from_state is None else torch.load(args.from_state, weights_only=True)
    algo = args.algo if state is None else state["algo"]
    start = "a fresh start" if state is None else f"{args.from_state}"
    torch.set_default_dtype(getattr(torch, args.dtype))
    print(
        f"{algo}: {args.against} against TorchRL from {start}, {args.dtype}: largest "
        "|difference| of the parameters"
    )
    differences = drift(
        args.against, args.updates, algo, args.env_id, every=args.every, state=state
    )
    for update, critics, policies in differences:
        print(f"update {update}: critics {critics:.1e}, policies {policies:.1e}")


if __name__ == "__main__":
    main()
