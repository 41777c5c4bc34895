"""``DreamerV3ValueLoss``: DreamerV3's critic loss, on imagined and replayed sequences.

Hafner, Pasukonis, Ba and Lillicrap, "Mastering Diverse Domains through World Models",
arXiv:2301.04104, section 3 ("critic learning"): the critic regresses the imagined
lambda-returns with a two-hot (or symlog) loss, optionally towards a slow critic and on replayed
sequences. The world model's loss is :class:`rlloss.DreamerV3ModelLoss`
(``world_models/dreamer_v3.py``). The maths is in :mod:`rlloss.functional.world_models`.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._networks import NetworkCall
from rlloss.common import LossModule, accepts_tensor_arguments
from rlloss.world_models.base import imagined_lambda_target, legacy_logits

VALUE_LOSSES = ("symlog_mse", "two_hot")


class DreamerV3ValueLoss(LossModule):
    r"""DreamerV3's critic loss on imagined trajectories, and on replayed sequences.

    $$
    \mathcal{L}_{\text{value}} = \operatorname{reduce}\Big(w_t \big(L(v(s_t), R_t)
    + \beta L(v(s_t), v_{\text{slow}}(s_t))\big)\Big)
    $$

    with ``R_t`` the imagined ``lambda_target`` (written by the actor loss), ``w_t`` the batch's
    ``discount_weight`` when it has one, else ``gamma^t`` along the last batch dim
    (``discount_loss=True`` and a ``[B, T]`` batch) or 1, ``L`` the two-hot cross-entropy of the
    value logits (``"two_hot"``) or the symlog squared error of the value (``"symlog_mse"``),
    ``beta = slow_critic_regularization`` and ``v_slow`` the target critic (a copy updated by
    ``SoftUpdate``). ``value_slow_loss`` reports the second term, detached.

    TorchRL's ``DreamerV3ValueLoss`` with the same keywords, keys and outputs: ``forward``
    returns ``(losses, fake_data)``; the value network's parameters are ``value_model_params``
    (the network's own tensors, shared with the actor loss) and the slow critic's
    ``target_value_model_params``. :meth:`replay_value_loss` trains the critic on real sequences.

    Reference: Hafner et al., "Mastering Diverse Domains through World Models",
    arXiv:2301.04104.

    Args:
        value_model: writes ``state_value`` (and ``state_value_logits`` for ``"two_hot"``).
        value_loss: ``"symlog_mse"`` (default) or ``"two_hot"``.
        discount_loss: weight the steps by ``gamma^t`` (default ``True``).
        gamma: the discount, unless ``actor_loss`` is given (then its estimator's, each call).
        num_value_bins: the two-hot support size (255).
        actor_loss: a ``DreamerV3ActorLoss`` whose ``gamma`` to use.
        slow_critic_regularization: ``beta`` >= 0 (default 0: no target critic).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

    Differences from TorchRL: the discount read from ``actor_loss`` stays a tensor (TorchRL reads
    it with ``.item()``, a device sync, on every call).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import MLP
        >>> from rlloss import DreamerV3ValueLoss
        >>> value = TensorDictModule(
        ...     MLP(in_features=21, out_features=1, num_cells=[8]),
        ...     ["state", "belief"],
        ...     ["state_value"],
        ... )
        >>> imagined = (
        ...     TensorDict(  # what DreamerV3ActorLoss returns: latent states and their targets
        ...         state=torch.randn(4, 15, 15),
        ...         belief=torch.randn(4, 15, 6),
        ...         lambda_target=torch.randn(4, 15, 1),
        ...         batch_size=[4, 15],
        ...     )
        ... )
        >>> value_loss = DreamerV3ValueLoss(
        ...     value
        ... )  # actor_loss=...: the actor loss's targets and weights
        >>> losses, _ = value_loss(imagined.detach())
        >>> losses["loss_value"].backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by DreamerV3ValueLoss (``reward``, ``done``, ``terminated`` under "next",
        for :meth:`replay_value_loss`)."""

        value: NestedKey = "state_value"  # the critic's V(s), [*B, T, 1]
        value_logits: NestedKey = "state_value_logits"  # two-hot critic logits, [*B, T, bins]
        discount_weight: NestedKey = "discount_weight"  # optional, [*B, T, 1]
        reward: NestedKey = "reward"  # imagined reward, [*B, T, 1]
        done: NestedKey = "done"  # imagined episode end, [*B, T, 1]
        terminated: NestedKey = "terminated"  # imagined termination, [*B, T, 1]
        bootstrap: NestedKey = "bootstrap"  # each replay state's first imagined return, [*B, T]

    value_model: nn.Module
    value_model_params: TensorDictParams
    target_value_model_params: TensorDictParams
    gamma = Coefficient(low=0.0, high=1.0)  # the estimators' range, on assignment too
    slow_critic_regularization = Coefficient(low=0.0)
    _choices = {**LossModule._choices, "value_loss": VALUE_LOSSES}

    def __init__(
        self,
        value_model: nn.Module,
        value_loss: str = "symlog_mse",
        discount_loss: bool = True,
        gamma: float = 0.99,
        num_value_bins: int = 255,
        actor_loss: nn.Module | None = None,
        slow_critic_regularization: float = 0.0,
        reduction: str | None = None,
    ) -> None:
        super().__init__()
        self.reduction = self._check_reduction(reduction)
        if slow_critic_regularization < 0:  # TorchRL's words
            raise ValueError(
                "slow_critic_regularization must be non-negative, got "
                f"{slow_critic_regularization}."
            )
        if value_loss not in VALUE_LOSSES:
            raise ValueError(f"value_loss must be 'symlog_mse' or 'two_hot', got '{value_loss}'")
        self._register_coefficients(
            gamma=gamma, slow_critic_regularization=slow_critic_regularization
        )
        self.convert_to_functional(
            value_model, "value_model", create_target_params=bool(slow_critic_regularization)
        )
        self._value_call = NetworkCall(value_model)
        self._logits_calls: dict = {}  # the network up to its logits, by logits key
        self.value_loss, self.discount_loss = value_loss, discount_loss
        self.__dict__["_actor_loss"] = actor_loss  # not a submodule: its parameters are its own
        self.register_buffer("value_bins", rlf.symexp_bins(num_value_bins))

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        pass

    def _discount(self):
        """``gamma``: the actor loss's estimator's (a tensor, no sync) or the loss's own."""
        actor_loss = self.__dict__.get("_actor_loss")
        return self.gamma if actor_loss is None else actor_loss.value_estimator.gamma

    def sync_gamma_with_actor_loss(self, actor_loss) -> None:
        """Copy ``gamma`` from ``actor_loss``'s value estimator (prefer ``actor_loss=``)."""
        self.gamma = float(actor_loss.value_estimator.gamma)

    def _predictions(self, batch: TensorDictBase) -> torch.Tensor:
        """The value logits ``[*B, K]`` (``"two_hot"``) or values ``[*B]``."""
        if self.value_loss == "symlog_mse":
            return self._output(self._value_call(batch), "value").squeeze(-1)
        logits = legacy_logits(self, self._logits_call()(batch), "value_logits", "value")
        if logits.shape[-1] != self.value_bins.shape[0]:
            raise ValueError(
                f"value_loss='two_hot' expects the value head to output logits over "
                f"{self.value_bins.shape[0]} bins, got trailing dim {logits.shape[-1]}."
            )
        return logits

    def _logits_call(self) -> NetworkCall:
        """The value network run up to the module writing ``tensor_keys.value_logits`` (a
        two-hot head's decode, which the loss does not read, skipped); the whole network when
        no planned module writes that key."""
        key = self.tensor_keys.value_logits
        call = self._logits_calls.get(key)
        if call is None:
            call = self._logits_calls[key] = NetworkCall(self._value_call.module, until=key)
        return call

    def _output(self, outputs, name: str) -> torch.Tensor:
        key = getattr(self.tensor_keys, name)
        value = outputs.get(key, None)
        if value is None:
            raise KeyError(
                f"{type(self).__name__}: the value network wrote {list(outputs.keys())}, not "
                f"tensor_keys.{name} = {key!r}; set it with set_keys({name}=...)."
            )
        return value

    def _step_loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.value_loss == "two_hot":
            return rlf.two_hot_cross_entropy(prediction, target, self.value_bins)
        return rlf.symlog_squared_error(prediction, target)

    def _slow_critic_value(self, batch: TensorDictBase) -> torch.Tensor:
        """The slow (target) critic's decoded value ``v_slow(s)``, ``[*B]``, without gradient."""
        with (
            torch.no_grad(),
            self.target_value_model_params.to_module(self.value_model, preserve_module_state=False),
        ):
            outputs = self._value_call(batch)
        value = self._output(outputs, "value")
        if self.value_loss == "two_hot" and value.shape[-1] == self.value_bins.shape[0]:
            value = rlf.two_hot_decode(value, self.value_bins).unsqueeze(-1)
        return value.squeeze(-1)

    def _weights(self, batch: TensorDictBase, target: torch.Tensor) -> torch.Tensor:
        given = self._read(batch, "discount_weight")
        if given is not None:
            return given.squeeze(-1)
        if self.discount_loss and target.ndim >= 2:
            ones = torch.ones_like(target).unsqueeze(-1)
            return rlf.imagination_weights(ones, self._discount()).squeeze(-1)
        return torch.ones_like(target)

    @accepts_tensor_arguments
    def forward(self, fake_data: TensorDictBase) -> tuple[TensorDict, TensorDictBase]:
        """``loss_value`` and ``value_slow_loss`` on imagined states with their
        ``lambda_target``."""
        target = imagined_lambda_target(self, fake_data, "DreamerV3ActorLoss").squeeze(-1)
        prediction = self._predictions(fake_data)
        loss = self._step_loss(prediction, target)
        slow = torch.zeros_like(loss)
        if self.slow_critic_regularization:
            slow = self._step_loss(prediction, self._slow_critic_value(fake_data))
            loss = loss + self.slow_critic_regularization * slow
        weights = self._weights(fake_data, target)
        out = {"loss_value": rlf.reduce(weights * loss, self.reduction)}
        out["value_slow_loss"] = rlf.reduce(weights * slow, self.reduction).detach()
        return TensorDict(out), fake_data.data

    def replay_value_loss(
        self, tensordict: TensorDictBase, *, horizon: float = 333.0, lmbda: float = 0.95
    ) -> TensorDict:
        """The critic loss on real sequences ``[B, T]``: the lambda-return of state ``k`` from the
        rewards at ``k + 1`` on, bootstrapped by each state's first imagined return
        (``tensor_keys.bootstrap``), discount ``1 - 1 / horizon``; the last step and the steps
        that end an episode are left out. Gradients reach the value network's inputs.
        Returns ``loss_replay_value``, unweighted."""
        flags = [self._get(tensordict, name, nested=True) for name in ("done", "terminated")]
        reward = self._get(tensordict, "reward", nested=True)
        done, terminated = (flag.reshape(tensordict.batch_size).bool() for flag in flags)
        bootstrap = self._get(tensordict, "bootstrap").reshape(tensordict.batch_size)
        reward = reward.reshape(tensordict.batch_size)
        with torch.no_grad():
            target = rlf.td_lambda_return(
                *(x[..., 1:].unsqueeze(-1) for x in (reward, bootstrap, done, terminated)),
                gamma=1 - 1 / horizon,
                lmbda=lmbda,
            ).squeeze(-1)
        prediction = self._predictions(tensordict)
        prediction = (
            prediction[..., :-1, :] if prediction.ndim > target.ndim else prediction[..., :-1]
        )
        loss = self._step_loss(prediction, target)
        if self.slow_critic_regularization:
            slow_target = self._slow_critic_value(tensordict)[..., :-1]
            loss = loss + self.slow_critic_regularization * self._step_loss(prediction, slow_target)
        weights = (~done[..., :-1]).to(loss.dtype)
        return TensorDict(loss_replay_value=rlf.reduce(weights * loss, self.reduction))
