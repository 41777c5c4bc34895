"""CrossQ (SAC without target networks, batch-normalised critics that see the current and the
next transitions in one batch): CrossQLoss and its hand-written plain-torch baseline."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torchrl.modules import BatchRenorm1d

from benchmarks.cases.common import (
    ACT_DIM,
    GAMMA,
    HIDDEN,
    HIDDEN_TEXT,
    OBS_DIM,
    described,
    detached_call,
    on_device,
    policy_net,
    q_module,
    random_replay,
    tanh_normal_sample,
)
from benchmarks.cases.sac import actor_of, soft_actor_critic_factories
from benchmarks.harness import CaseSetup, Method

BATCH_SIZES = (256, 4096)  # SAC's: the critics see twice as many rows ([s, a; s', a'])
NUM_CRITICS = 2
KWARGS = {
    "num_qvalue_nets": NUM_CRITICS,
    "loss_function": "l2",
    "alpha_init": 1.0,
    "target_entropy": -float(ACT_DIM),
}


class CrossQCritic(nn.Module):
    """The authors' critic: BatchRenorm on the input and after each hidden ReLU layer, ``Q(s, a)``
    from ``[s, a]`` (Bhatt et al., Section 4; TorchRL's BatchRenorm1d, in its batch-norm warm-up
    for the first 10,000 training calls: the same computation as after it)."""

    def __init__(self) -> None:
        super().__init__()
        width = OBS_DIM + ACT_DIM
        layers: list[nn.Module] = [BatchRenorm1d(width)]
        for hidden in HIDDEN:
            layers += [nn.Linear(width, hidden), nn.ReLU(), BatchRenorm1d(hidden)]
            width = hidden
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([observation, action], -1))


def plain_crossq_loss(nets: dict, batch) -> Callable[[], torch.Tensor]:
    """CrossQ written by hand (the authors' structure, Algorithm 1): one module per critic, each
    called once in train mode on ``[s; s']`` and ``[a; a']`` (the batch statistics are the joint
    batch's), the target from the stop-gradient ``s'`` half, no target network; the actor's
    ``Q(s, a~)`` with the critics in eval mode (the running statistics the joint pass just
    updated) and no gradient to them; SAC's temperature loss. ``a'`` is drawn before ``a~``, as
    the libraries draw them."""
    actor_net, critics, log_alpha = nets["actor_net"], nets["critics"], nets["log_alpha"]
    obs, action, next_obs = batch["observation"], batch["action"], batch["next", "observation"]
    reward, not_terminated = batch["next", "reward"], ~batch["next", "terminated"]
    size = obs.shape[0]

    def loss() -> torch.Tensor:
        alpha = log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = tanh_normal_sample(actor_net, next_obs)
        observations, actions = torch.cat([obs, next_obs]), torch.cat([action, next_action])
        joint = torch.stack([c(observations, actions) for c in critics])  # [N, 2B, 1], train mode
        values, next_values = joint[:, :size], joint[:, size:].detach()
        with torch.no_grad():
            next_value = next_values.min(0).values - alpha * next_log_prob.unsqueeze(-1)
            target = reward + GAMMA * not_terminated * next_value
        critic_loss = F.mse_loss(values, target.expand_as(values), reduction="none").sum(0).mean()
        td_error = (values - target).detach().abs().max(0)  # noqa: F841 - written by the libraries
        new_action, log_prob = tanh_normal_sample(actor_net, obs)
        for c in critics:
            c.eval()
        q = torch.stack([detached_call(c, obs, new_action) for c in critics])
        for c in critics:
            c.train()
        actor_loss = (alpha * log_prob - q.min(0).values.squeeze(-1)).mean()
        alpha_loss = -(log_alpha * (log_prob.detach() + KWARGS["target_entropy"])).mean()
        entropy = -log_prob.detach().mean()  # noqa: F841 - reported by the libraries
        return actor_loss + critic_loss + alpha_loss

    return loss


def stacked_critic_grads(loss: nn.Module) -> Callable[[], dict[str, torch.Tensor]]:
    """The gradients of a library's stacked critics, ``[N, ...]`` each, by parameter name."""
    params = loss.qvalue_network_params.flatten_keys(".")
    names = [name for name, tensor in params.items() if tensor.requires_grad]
    return lambda: {f"critic.{name}": params[name].grad for name in names}


def plain_method(nets: dict, batch, params: dict) -> Method:
    """The plain baseline on ``nets``; the critics' gradients stacked as the libraries hold
    them (named under the ``ValueOperator``'s ``module``, as theirs)."""
    critics = nets["critics"]

    def critic_grads() -> dict[str, torch.Tensor]:
        return {
            f"critic.module.{name}": torch.stack([c.get_parameter(name).grad for c in critics])
            for name, _ in critics[0].named_parameters()
        }

    return Method(
        loss=plain_crossq_loss(nets, batch),
        params=params,
        trainable=(
            nets["log_alpha"],
            *nets["actor_net"].parameters(),
            *(p for c in critics for p in c.parameters()),
        ),
        gated_grads=critic_grads,
    )


def library_loss(library, nets: dict) -> nn.Module:
    """``library``'s (rlloss or TorchRL) CrossQLoss on ``nets``."""
    actor = actor_of(nets["actor_net"], False)
    qs = [q_module(c, False) for c in nets["critics"]]
    loss = library.CrossQLoss(actor, qs, **KWARGS)
    loss.make_value_estimator(gamma=GAMMA)
    return loss


def build(batch_size: int, seed: int) -> CaseSetup:
    """The CrossQLoss case at ``batch_size``."""
    torch.manual_seed(seed)
    actor_net = policy_net(False, ACT_DIM)
    critics = [CrossQCritic() for _ in range(NUM_CRITICS)]
    batch = random_replay(batch_size, seed + 1)
    on_device(actor_net, *critics)
    return CaseSetup(
        batches={"replay": batch},
        factories=soft_actor_critic_factories(
            {"actor_net": actor_net, "critics": critics},
            library_loss,
            plain_method,
            library_grads=stacked_critic_grads,
        ),
        description=(
            f"{described('CrossQLoss', KWARGS)}; TanhNormal actor, {NUM_CRITICS} critics with "
            f"BatchRenorm1d on the input and after each hidden layer (in train mode for the joint "
            f"[s, a; s', a'] pass, eval mode for the actor), MLPs {HIDDEN_TEXT} relu, obs "
            f"{OBS_DIM}, action dim {ACT_DIM}, no target critics; the critics' gradients gated"
        ),
    )


CASES = {"CrossQLoss": build}
