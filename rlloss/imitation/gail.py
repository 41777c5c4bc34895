"""``GAILLoss``: the discriminator of Generative Adversarial Imitation Learning (Ho & Ermon,
arXiv:1606.03476), with WGAN-GP's gradient penalty (Gulrajani et al., arXiv:1704.00028), and
the reward it gives a policy."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey, unravel_key
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._networks import NetworkCall
from rlloss.common import accepts_tensor_arguments
from rlloss.imitation.base import SupervisedLoss


class GAILLoss(SupervisedLoss):
    r"""GAIL's discriminator loss: $D(s, a)$, the probability that a pair is the expert's,
    learns to tell the expert's pairs from the policy's (collected) ones, elementwise
    (:func:`rlloss.functional.discriminator_cross_entropy`), with ``use_grad_penalty`` a
    gradient penalty:

    $$
    \mathcal{L} = -\log D(s_E, a_E) - \log\big(1 - D(s, a)\big), \qquad
    \mathcal{L}_{\text{gp}} = \lambda_{\text{gp}} \frac{1}{N} \sum
    \big(\lVert \nabla D(\tilde{x}) \rVert_2 - 1\big)^2
    $$

    at random points $\tilde{x}$ between the two batches (each element mixed with its own
    uniform weight, as TorchRL's; :func:`rlloss.functional.gradient_penalty`), added to every
    element before the reduction, and reported detached. The policy learns from :meth:`reward`
    with any of rlloss's losses (:func:`rlloss.functional.gail_reward`).

    TorchRL's ``GAILLoss`` with the same keywords, keys and outputs. The discriminator reads
    the expert's keys (``expert_observation``, ``expert_action``: its ``in_keys``) and writes
    ``discriminator_pred``, a probability (a sigmoid head), ``[*B, 1]``; it runs once on the
    two batches concatenated along the first batch dim, which therefore need the same
    layout (the same shapes).

    Keys (``set_keys``): ``expert_action`` (``"action"``), ``expert_observation``
    (``"observation"``), ``collector_action`` (``"collector_action"``),
    ``collector_observation`` (``"collector_observation"``), ``discriminator_pred``
    (``"d_logits"``).

    Reference: Ho and Ermon, "Generative Adversarial Imitation Learning", arXiv:1606.03476; the
    gradient penalty: Gulrajani et al., "Improved Training of Wasserstein GANs", arXiv:1704.00028.

    Args:
        discriminator_network: a TensorDict module, the pair -> ``D`` in (0, 1).
        use_grad_penalty: add the gradient penalty (default ``False``). It differentiates
            ``D`` with ``torch.autograd.grad``, which ``torch.compile(fullgraph=True)`` cannot
            trace: compile the loss without it.
        gp_lambda: the penalty's weight, >= 0 (default 10).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``[*B, 1]``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule, TensorDictSequential
        >>> from torchrl.modules import MLP
        >>> from rlloss import GAILLoss
        >>> discriminator = TensorDictSequential(
        ...     TensorDictModule(
        ...         MLP(in_features=4, out_features=1, num_cells=[16]),
        ...         ["observation", "action"],
        ...         ["score"],
        ...     ),
        ...     TensorDictModule(torch.nn.Sigmoid(), ["score"], ["d_logits"]),
        ... )  # D(s, a) in (0, 1)
        >>> expert_and_policy_pairs = TensorDict(
        ...     observation=torch.randn(8, 3),
        ...     action=torch.rand(8, 1),  # the expert's
        ...     collector_observation=torch.randn(8, 3),
        ...     collector_action=torch.rand(8, 1),  # the policy's
        ...     batch_size=[8],
        ... )
        >>> gail = GAILLoss(discriminator, use_grad_penalty=True)
        >>> gail(expert_and_policy_pairs)["loss"].backward()
        >>> rollout = TensorDict(
        ...     observation=torch.randn(16, 3), action=torch.rand(16, 1), batch_size=[16]
        ... )
        >>> rollout["next", "reward"] = gail.reward(rollout)  # then PPO on the rollout
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by GAILLoss."""

        expert_action: NestedKey = "action"  # the demonstrated action, [*B, A]
        expert_observation: NestedKey = "observation"  # its observation, [*B, *O]
        collector_action: NestedKey = "collector_action"  # the policy's action, [*B, A]
        collector_observation: NestedKey = "collector_observation"  # its observation, [*B, *O]
        discriminator_pred: NestedKey = "d_logits"  # D(s, a), written by the discriminator, [*B, 1]

    gp_lambda = Coefficient(low=0.0)

    def __init__(
        self,
        discriminator_network: nn.Module,
        *,
        use_grad_penalty: bool = False,
        gp_lambda: float = 10,
        reduction: str | None = None,
    ) -> None:
        super().__init__(reduction)
        self._register_networks(discriminator_network=discriminator_network)
        self.use_grad_penalty = bool(use_grad_penalty)
        self._register_coefficients(gp_lambda=gp_lambda)
        self._discriminator_call = NetworkCall(discriminator_network)

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = {*self.discriminator_network.in_keys}
        keys.update(getattr(self.tensor_keys, name) for name in self._read_keys)
        return sorted(keys, key=str)

    _read_keys = (
        "expert_observation",
        "expert_action",
        "collector_observation",
        "collector_action",
    )

    @property
    def out_keys(self) -> list[str]:
        return ["loss", "gp_loss"] if self.use_grad_penalty else ["loss"]

    def _pairs(self, tensordict: TensorDictBase) -> dict[str, torch.Tensor]:
        pairs = {name: self._get(tensordict, name) for name in self._read_keys}
        for kind in ("observation", "action"):
            expert, policy = pairs[f"expert_{kind}"], pairs[f"collector_{kind}"]
            if expert.shape != policy.shape:
                raise ValueError(
                    f"GAILLoss: the expert's {kind}s {self._key(f'expert_{kind}')!r} have shape "
                    f"{tuple(expert.shape)} and the policy's "
                    f"{self._key(f'collector_{kind}')!r} {tuple(policy.shape)}: the discriminator "
                    "scores both batches in one call, so they need the same layout (as many "
                    "pairs, the same feature sizes)."
                )
        return pairs

    def _key(self, name: str) -> NestedKey:
        return getattr(self.tensor_keys, name)

    def _discriminate(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``D`` on pairs ``[*S, ...]``, under the expert's keys (the discriminator's inputs)."""
        inputs = {  # keyed as the discriminator holds its in_keys
            unravel_key(self._key("expert_observation")): observation,
            unravel_key(self._key("expert_action")): action,
        }
        size = observation.shape[: max(action.ndim - 1, 1)]
        return self._discriminator_call.on_inputs(inputs, size)[self._key("discriminator_pred")]

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``{"loss": ..., "gp_loss": ...}`` on a batch of expert and policy pairs."""
        tensordict = self._without_padding(tensordict)
        pairs = self._pairs(tensordict)
        observation = torch.cat([pairs["expert_observation"], pairs["collector_observation"]])
        action = torch.cat([pairs["expert_action"], pairs["collector_action"]])
        expert, policy = self._discriminate(observation, action).chunk(2, dim=0)
        if not self.use_grad_penalty:
            loss = self._reduce_formula(rlf.discriminator_cross_entropy, tensordict, expert, policy)
            return TensorDict({"loss": loss}, batch_size=[])
        gp_loss = self._gradient_penalty(pairs)
        loss = rlf.discriminator_cross_entropy(expert, policy) + gp_loss
        return TensorDict(
            {"gp_loss": gp_loss.detach(), "loss": self._reduce_valid(loss, tensordict)},
            batch_size=[],
        )

    def _gradient_penalty(self, pairs: dict[str, torch.Tensor]) -> torch.Tensor:
        """``gp_lambda * mean((||grad_x D(x~)||_2 - 1)^2)``, ``x~`` between the batches."""
        inputs = []
        for kind in ("observation", "action"):
            expert, policy = pairs[f"expert_{kind}"], pairs[f"collector_{kind}"]
            weight = torch.rand(expert.shape, device=expert.device, dtype=expert.dtype)
            inputs.append(rlf.interpolate(policy, expert, weight).detach().requires_grad_(True))
        prediction = self._discriminate(*inputs)
        gradients = torch.autograd.grad(
            prediction, inputs, torch.ones_like(prediction), create_graph=True
        )
        return rlf.gradient_penalty(torch.cat(gradients, dim=-1), self.gp_lambda).mean()

    @torch.no_grad()
    def reward(self, tensordict: TensorDictBase, form: str = "positive") -> torch.Tensor:
        """The reward of the pairs ``tensordict`` holds under the discriminator's own input keys
        (a rollout's ``observation`` and ``action``), ``[*B, 1]``, without gradient:
        ``-log(1 - D)`` (``form="positive"``, default), ``log D`` (``"negative"``) or ``log D -
        log(1 - D)`` (``"logit"``); see :func:`rlloss.functional.gail_reward`. Store it as the
        batch's reward for any of rlloss's on- or off-policy losses."""
        probability = self._discriminator_call(tensordict)[self._key("discriminator_pred")]
        return rlf.gail_reward(probability, form)
