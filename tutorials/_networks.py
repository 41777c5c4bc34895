"""The networks of the CartPole policy-gradient tutorials: a categorical policy and a value
function, separate 64-64 tanh MLPs (stable-baselines3's default for A2C and PPO)."""

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator


def categorical_actor_critic(
    obs_dim: int, num_actions: int, device: torch.device
) -> tuple[ProbabilisticActor, ValueOperator]:
    """``(actor, critic)``. The actor writes ``"logits"`` for ``"observation"`` and samples
    ``"action"`` from ``Categorical(logits)``: the policy pi(a|s). The critic writes
    ``"state_value"``: V(s)."""
    policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
                     activation_class=nn.Tanh)
    actor = ProbabilisticActor(
        TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
    )
    critic = ValueOperator(
        MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
        in_keys=["observation"],
    )
    return actor.to(device), critic.to(device)
