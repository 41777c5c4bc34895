"""V-trace: off-policy corrected value targets (``VTrace``)."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_in_range
from rlloss._distribution_calls import DistributionCall
from rlloss._networks import action_log_prob, as_list, stored_log_prob
from rlloss.estimators.base import ValueEstimator
from rlloss.estimators.value_norm import ValueNormalizer


class VTrace(ValueEstimator):
    r"""V-trace (Espeholt et al., arXiv:1802.01561): off-policy corrected value targets and
    advantages (:func:`rlloss.functional.vtrace`).

    $$
    v_t = V(s_t) + \delta_t + \gamma (1 - \text{done}_t) c_t \big(v_{t+1} - V(s_{t+1})\big),
    \qquad
    \delta_t = \rho_t \big(r_t + \gamma (1 - \text{terminated}_t) V(s_{t+1}) - V(s_t)\big)
    $$

    $$
    A_t = \rho_t \big(r_t + \gamma (1 - \text{terminated}_t) v_{t+1} - V(s_t)\big), \qquad
    \rho_t = \min\Big(\bar{\rho}, \frac{\pi(a_t \mid s_t)}{\mu(a_t \mid s_t)}\Big), \quad
    c_t = \min\Big(\bar{c}, \frac{\pi(a_t \mid s_t)}{\mu(a_t \mid s_t)}\Big)
    $$

    ($v_{t+1}$ is $V(s_{t+1})$ where the trajectory is cut), with the importance ratio
    $\pi / \mu$ from the current ``actor_network`` (held out of the graph) and the behaviour
    log-prob ``sample_log_prob`` stored at collection.

    Difference from TorchRL: TorchRL's ``VTrace`` scores a fresh action drawn from the current
    policy (or its mode) instead of the action taken; rlloss scores the taken action
    (``tensor_keys.action``), as the paper's ratio is defined.

    ``average_adv=True`` standardises the advantage over the batch (within the groups of
    ``group_key`` when set), as TorchRL's.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import VTrace
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(4, 16, 3),
        ...         "next": {
        ...             "observation": torch.randn(4, 16, 3),
        ...             "reward": torch.randn(4, 16, 1),
        ...             "done": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [4, 16],
        ... )  # [num_envs, T]
        >>> batch["action"] = torch.randint(2, (4, 16))
        >>> batch["action_log_prob"] = torch.full((4, 16), -0.69)  # the behaviour policy's
        >>> vtrace = VTrace(gamma=0.99, actor_network=actor, value_network=critic)
        >>> batch = vtrace(batch)  # importance-weighted targets, clipped at rho_thresh and c_thresh
    """

    @dataclasses.dataclass
    class _AcceptedKeys(ValueEstimator._AcceptedKeys):
        action: NestedKey = "action"  # the action taken, scored by the current policy, [*B, T, *A]

    # checked on assignment as at construction
    rho_thresh = Coefficient(low=0.0, low_open=True)
    c_thresh = Coefficient(low=0.0, low_open=True)

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        actor_network: nn.Module,
        value_network: nn.Module | None = None,
        rho_thresh: float | torch.Tensor = 1.0,
        c_thresh: float | torch.Tensor = 1.0,
        average_adv: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        advantage_key: NestedKey | None = None,
        value_target_key: NestedKey | None = None,
        value_key: NestedKey | None = None,
        shifted: bool = False,
        device: torch.device | None = None,
        time_dim: int | None = None,
        value_chunk_size: int | None = None,
        num_chunks: int | None = None,
        num_chunk: int | None = None,
        value_chunk_dim: int = 0,
        shifted_budget: int = 1,
        group_key: NestedKey | None = None,
        value_normalizer: ValueNormalizer | None = None,
    ) -> None:
        super().__init__(
            gamma=gamma,
            value_network=value_network,
            shifted=shifted,
            differentiable=differentiable,
            skip_existing=skip_existing,
            advantage_key=advantage_key,
            value_target_key=value_target_key,
            value_key=value_key,
            device=device,
            value_chunk_size=value_chunk_size,
            num_chunks=num_chunks,
            num_chunk=num_chunk,
            value_chunk_dim=value_chunk_dim,
            shifted_budget=shifted_budget,
            group_key=group_key,
            time_dim=time_dim,
            value_normalizer=value_normalizer,
        )
        check_in_range("rho_thresh", rho_thresh, 0.0, low_open=True)
        check_in_range("c_thresh", c_thresh, 0.0, low_open=True)
        self.actor_network = actor_network
        self._actor_call = DistributionCall(actor_network)
        sample_keys = getattr(actor_network, "dist_sample_keys", None)
        if sample_keys:  # the actor's action key is where the batch holds the taken action
            self.tensor_keys.action = sample_keys[0] if len(sample_keys) == 1 else sample_keys
        log_prob_keys = getattr(actor_network, "log_prob_keys", None)
        if log_prob_keys and len(log_prob_keys) == 1:
            self.tensor_keys.sample_log_prob = log_prob_keys[0]
        self.rho_thresh, self.c_thresh = float(rho_thresh), float(c_thresh)
        self.average_adv = average_adv

    @classmethod
    def for_loss(cls, loss_module: nn.Module, **hyperparams) -> VTrace:
        """A V-trace estimator for ``loss_module`` (TorchRL's registry hook): the loss's actor
        unless ``actor_network`` is given, its critic as :meth:`ValueEstimator.for_loss`."""
        hyperparams.setdefault("actor_network", loss_module.actor_network)
        return super().for_loss(loss_module, **hyperparams)

    def _policy_keys(self) -> list[NestedKey]:
        return [*self.actor_network.in_keys, *as_list(self.tensor_keys.sample_log_prob)]

    def _estimate_inputs(self, tensordict: TensorDictBase, value: torch.Tensor, valid) -> dict:
        owner = type(self).__name__
        with torch.no_grad():
            distribution = self._actor_call(tensordict)
            log_pi = action_log_prob(distribution, tensordict, self.tensor_keys.action, owner)
        log_mu = stored_log_prob(tensordict, self.tensor_keys.sample_log_prob, owner)
        groups = self._groups(tensordict) if self.average_adv else None
        return {"log_rho": (log_pi - log_mu).reshape(value.shape), "groups": groups}

    def estimate(
        self, *, reward, value, next_value, done, terminated, gamma, time_dim, log_rho, groups
    ):
        advantage, value_target = rlf.vtrace(
            reward,
            value,
            next_value,
            done,
            terminated,
            log_rho,
            gamma,
            self.rho_thresh,
            self.c_thresh,
            time_dim,
        )
        if not self.average_adv:
            return advantage, value_target
        if groups is not None:  # TorchRL's average_adv: over the batch, or within the groups
            return rlf.group_standardize(advantage, groups, eps=1e-5), value_target
        return (advantage - advantage.mean()) / advantage.std().clamp_min(1e-5), value_target
