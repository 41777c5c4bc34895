"""V-trace: off-policy corrected value targets (``VTrace``)."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import check_in_range
from rlloss._networks import DistributionCall, action_log_prob, as_list, stored_log_prob
from rlloss.estimators.base import ValueEstimator


class VTrace(ValueEstimator):
    """V-trace (Espeholt et al., arXiv:1802.01561): off-policy corrected value targets and
    advantages (:func:`rlloss.functional.vtrace`), the importance ratio ``pi(a|s) / mu(a|s)``
    from the current ``actor_network`` (held out of the graph) and the behaviour log-prob
    ``sample_log_prob`` stored at collection.

    Difference from TorchRL: TorchRL's ``VTrace`` scores a fresh action drawn from the current
    policy (or its mode) instead of the action taken; rlloss scores the taken action
    (``tensor_keys.action``), as the paper's ratio is defined.

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
        action: NestedKey = "action"  # the action taken, scored by the current policy

    def __init__(
        self,
        *,
        gamma: float,
        actor_network: nn.Module,
        rho_thresh: float = 1.0,
        c_thresh: float = 1.0,
        **kwargs,
    ) -> None:
        super().__init__(gamma=gamma, **kwargs)
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

    def _policy_keys(self) -> list[NestedKey]:
        return [*self.actor_network.in_keys, *as_list(self.tensor_keys.sample_log_prob)]

    def _estimate_inputs(self, tensordict: TensorDictBase, value: torch.Tensor) -> dict:
        owner = type(self).__name__
        with torch.no_grad():
            distribution = self._actor_call(tensordict)
            log_pi = action_log_prob(distribution, tensordict, self.tensor_keys.action, owner)
        log_mu = stored_log_prob(tensordict, self.tensor_keys.sample_log_prob, owner)
        return {"log_rho": (log_pi - log_mu).reshape(value.shape)}

    def estimate(self, *, reward, value, next_value, done, terminated, gamma, time_dim, log_rho):
        return rlf.vtrace(
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
