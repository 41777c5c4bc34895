"""``DiffusionBCLoss``: behaviour cloning of a diffusion policy by noise prediction (Ho et al.,
"Denoising Diffusion Probabilistic Models", arXiv:2006.11239; Chi et al., "Diffusion Policy",
arXiv:2303.04137)."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._networks import CALL_ERRORS
from rlloss.common import accepts_tensor_arguments
from rlloss.imitation.base import SupervisedLoss

DDPM_ATTRIBUTES = ("score_network", "num_steps", "alphas_cumprod")


class DiffusionBCLoss(SupervisedLoss):
    r"""Diffusion behaviour cloning: each demonstrated action $a_0$ is noised to a random step of
    the DDPM forward process and the score network regresses the noise:

    $$
    a_t = \sqrt{\bar{\alpha}_t}\, a_0 + \sqrt{1 - \bar{\alpha}_t}\, \epsilon, \qquad
    \mathcal{L}_{\text{diffusion\_bc}} = \big\lVert \epsilon
    - \epsilon_\theta(a_t, s, t) \big\rVert^2, \qquad
    t \sim U\{0, \ldots, T - 1\}, \quad \epsilon \sim N(0, I)
    $$

    (:func:`rlloss.functional.diffuse`, $\bar{\alpha}$ the actor's schedule,
    :func:`rlloss.functional.linear_beta_schedule` for TorchRL's ``DiffusionActor``;
    :func:`rlloss.functional.noise_prediction_error`), reduced over every element.

    TorchRL's ``DiffusionBCLoss`` with the same keywords, keys and output, and the same draws
    (``t`` then ``eps``) for the same seed. The batch's ``loss_mask_key`` masks apply (TorchRL
    ignores them).

    Keys (``set_keys``): ``action`` (the clean demonstrated action, default ``"action"``),
    ``observation`` (default ``"observation"``).

    Reference: Chi et al., "Diffusion Policy: Visuomotor Policy Learning via Action Diffusion",
    arXiv:2303.04137; the noise-prediction loss of Ho et al., "Denoising Diffusion Probabilistic
    Models", arXiv:2006.11239.

    Args:
        actor_network: TorchRL's ``DiffusionActor``, or a module whose ``.module`` holds
            ``score_network`` (``[a_t, s, t]`` -> ``eps``), ``num_steps`` and the schedule's
            ``alphas_cumprod`` (``[num_steps]``).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``[*B, D]``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import DiffusionActor
        >>> from rlloss import DiffusionBCLoss
        >>> demonstrations = TensorDict(
        ...     observation=torch.randn(8, 4), action=torch.rand(8, 2) * 2 - 1, batch_size=[8]
        ... )
        >>> loss = DiffusionBCLoss(DiffusionActor(action_dim=2, obs_dim=4, num_steps=100))
        >>> loss(demonstrations)["loss_diffusion_bc"].backward()  # the noise prediction's error
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by DiffusionBCLoss."""

        action: NestedKey = "action"  # the clean demonstrated action, [*B, D]
        observation: NestedKey = "observation"  # the policy's conditioning, [*B, *O]

    out_keys = ["loss_diffusion_bc"]

    def __init__(self, actor_network: nn.Module, *, reduction: str = "mean") -> None:
        super().__init__(reduction)
        ddpm = getattr(actor_network, "module", None)
        missing = [name for name in DDPM_ATTRIBUTES if not hasattr(ddpm, name)]
        if missing:
            raise TypeError(
                f"DiffusionBCLoss: actor_network.module must be a DDPM module holding "
                f"{list(DDPM_ATTRIBUTES)} (TorchRL's DiffusionActor); "
                f"{type(ddpm).__name__} lacks {missing}."
            )
        self._register_networks(plain=True, actor_network=actor_network)

    @property
    def in_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.observation, self.tensor_keys.action]

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``{"loss_diffusion_bc": ...}`` on a batch of observations and clean actions."""
        tensordict = self._without_padding(tensordict)
        action = self._get(tensordict, "action")
        observation = self._get(tensordict, "observation")
        ddpm = self.actor_network.module
        step = torch.randint(0, ddpm.num_steps, action.shape[:-1], device=action.device)
        noise = torch.randn_like(action)
        noisy = _noised(action, ddpm.alphas_cumprod, step, noise)
        inputs = torch.cat([noisy, observation, step.to(noisy.dtype).unsqueeze(-1)], dim=-1)
        try:
            prediction = ddpm.score_network(inputs)
        except CALL_ERRORS as error:
            raise _score_network_error(ddpm, action, observation, error) from error
        loss = self._reduce_formula(rlf.noise_prediction_error, tensordict, prediction, noise)
        return TensorDict({"loss_diffusion_bc": loss}, batch_size=[])


def _noised(action, schedule, step, noise) -> torch.Tensor:
    """``a_t`` (:func:`rlloss.functional.diffuse`) at the steps ``step`` of ``schedule``
    (``alpha_bar``); computed in float32 for a half-precision action, cast back."""
    if action.dtype in (torch.float16, torch.bfloat16):
        alpha_bar = schedule.to(device=action.device, dtype=torch.float32)[step]
        return rlf.diffuse(action.float(), alpha_bar, noise.float()).to(action.dtype)
    return rlf.diffuse(action, schedule.to(device=action.device, dtype=action.dtype)[step], noise)


def _score_network_error(ddpm, action: torch.Tensor, observation: torch.Tensor, error) -> Exception:
    """What a failed call of the score network on ``[noisy action, observation, step]`` raises:
    the entries' dtypes against the network's, or their sizes against its input size."""
    parameter = next((p for p in ddpm.score_network.parameters() if p.is_floating_point()), None)
    shapes = f"'action' {tuple(action.shape)}, 'observation' {tuple(observation.shape)}"
    for name, value in (("action", action), ("observation", observation)):
        if parameter is not None and value.is_floating_point() and value.dtype != parameter.dtype:
            return TypeError(
                f"DiffusionBCLoss: the batch's {name!r} has dtype {value.dtype}, but the score "
                f"network's parameters are {parameter.dtype}: cast the batch "
                f"(batch.to({parameter.dtype})) or the loss (loss.to({value.dtype}))."
            )
    return ValueError(
        f"DiffusionBCLoss: the score network failed on [noisy action, observation, step] of "
        f"{action.shape[-1]} + {observation.shape[-1]} + 1 features ({shapes}): store "
        "actions and observations of the DiffusionActor's action_dim and obs_dim. The network "
        f"raised: {error}"
    )
