"""DreamerV3's world-model and critic losses: ``DreamerV3ModelLoss``, ``DreamerV3ValueLoss``.

Hafner, Pasukonis, Ba and Lillicrap, "Mastering Diverse Domains through World Models",
arXiv:2301.04104. The world model is trained on real sequences with symlog reconstruction,
two-hot reward prediction and balanced KL with free bits (eq. 4-5); the critic regresses the
imagined lambda-returns with a two-hot (or symlog) loss, optionally towards a slow critic and
on replayed sequences (section 3, "critic learning"). The maths is in
:mod:`rlloss.functional.world_models`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.utils import NestedKey
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import Coefficient, MissingKeyError, check_choice, next_key
from rlloss._networks import NetworkCall
from rlloss.common import LossModule, accepts_tensor_arguments
from rlloss.world_models.base import (
    WorldModelLossBase,
    imagined_lambda_target,
    legacy_logits,
    reconstruction_error,
)

KL_MODES = ("balanced", "separate")
VALUE_LOSSES = ("symlog_mse", "two_hot")


class DreamerV3ModelLoss(WorldModelLossBase):
    r"""DreamerV3's world-model loss on real sequences ``[B, T]``.

    $$
    \mathcal{L}_{\text{model\_kl}} = \lambda_{\text{kl}} \frac{1}{N} \sum
    \Big(\alpha \max\big(\mathrm{KL}(\mathrm{sg}(q) \,\|\, p), f_b\big) + (1 - \alpha)
    \max\big(\mathrm{KL}(q \,\|\, \mathrm{sg}(p)), f_b\big)\Big)
    $$

    $$
    \mathcal{L}_{\text{model\_reco}} = \lambda_{\text{reco}} \sum_{\text{heads}}
    \frac{1}{B T} \sum_{b, t} \sum_{\text{event}}
    \big|\operatorname{symlog}(x) - \operatorname{symlog}(\hat{x})\big|^p
    $$

    In detail:

    - ``loss_model_kl = lambda_kl mean(alpha max(KL(sg(q) || p), fb) + (1 - alpha) max(KL(q ||
      sg(p)), fb))`` per categorical (``kl_mode="balanced"``), or the two terms of the paper
      summed over the categoricals before the free bits, ``loss_model_dynamic`` (weight
      ``lambda_kl lambda_dynamic``) and ``loss_model_representation`` (``lambda_kl
      lambda_representation``), with ``kl_mode="separate"``;
    - ``loss_model_reco = lambda_reco sum_heads mean_{B,T} sum_event
      |symlog(x) - symlog(x_hat)|^p``;
    - ``loss_model_reward = lambda_reward mean twohot_ce(reward_logits, r)`` (``reward_two_hot``) or
      the symlog squared error of a scalar reward;
    - ``loss_model_continue`` (``lambda_continue > 0``): binary cross-entropy of the continuation
      logit against ``continue_target_scale (1 - terminated)``.

    TorchRL's ``DreamerV3ModelLoss`` with the same keywords, keys (``set_keys``: ``pixels`` and
    ``reco_pixels`` may be lists, one per reconstruction head) and outputs: ``forward`` returns
    ``(losses, world_model_output)``, each loss of shape ``[1]``; the ground-truth reward is moved
    to ``("next", true_reward)`` in the world model's input so that the model can write its
    prediction under ``("next", reward)``.

    Reference: Hafner et al., "Mastering Diverse Domains through World Models",
    arXiv:2301.04104.

    Args:
        world_model: a module called on a shallow copy of the batch, writing the prior and
            posterior logits ``[B, T, C, K]``, the reconstructions and the reward prediction under
            ``"next"``.
        lambda_kl: weights (>= 0).
        lambda_reco: weights (>= 0).
        lambda_reward: weights (>= 0).
        lambda_continue: weights (>= 0).
        kl_mode: ``"balanced"`` (default) or ``"separate"``.
        lambda_dynamic: the separate terms' weights (1.0, 0.1).
        lambda_representation: the separate terms' weights (1.0, 0.1).
        unimix: uniform mixture of the categoricals in the separate KL, in [0, 1) (default 0).
        continue_target_scale: in (0, 1].
        kl_alpha: balancing weight alpha (0.8); free_bits: the free-bits threshold (1.0 nat).
        reco_loss: ``"l2"`` or ``"l1"``; reco_symlog: a bool, or one per head.
        reward_two_hot: two-hot reward logits (default) or a scalar reward.
        num_reward_bins: the two-hot support size (255); global_average: average over every
            dim instead of summing the event dims; detach_output: detach the returned output.

    Differences from TorchRL: the KL terms are computed from log-softmax (no ``1e-8`` clamp of
    the probabilities), so a categorical with a probability under ``1e-8`` has a finite KL and
    gradient where TorchRL's separate mode gives NaN.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.modules import SymExpTwoHot
        >>> from rlloss import DreamerV3ModelLoss
        >>> class WorldModel(torch.nn.Module):  # latent: 3 categoricals of 5 classes, a belief of 6
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.prior, self.posterior = (
        ...             torch.nn.Linear(21, 15),
        ...             torch.nn.Linear(21 + 4, 15),
        ...         )
        ...         self.decoder, self.reward = torch.nn.Linear(21, 4), torch.nn.Linear(21, 255)
        ...         self.decode = SymExpTwoHot(255)
        ...     def forward(self, td):
        ...         latent = torch.cat([td["state"], td["belief"]], -1)
        ...         seen = torch.cat([latent, td["next", "pixels"]], -1)
        ...         td["next", "prior_logits"] = self.prior(latent).unflatten(-1, (3, 5))
        ...         td["next", "posterior_logits"] = self.posterior(seen).unflatten(-1, (3, 5))
        ...         td["next", "reco_pixels"] = self.decoder(latent)
        ...         td["next", "reward_logits"] = self.reward(latent)
        ...         td["next", "reward"] = self.decode(td["next", "reward_logits"])
        ...         return td
        >>> sequences = TensorDict(  # [B, T] real transitions
        ...     {
        ...         "state": torch.randn(2, 4, 15),
        ...         "belief": torch.randn(2, 4, 6),
        ...         "next": {
        ...             "pixels": torch.randn(2, 4, 4),
        ...             "reward": torch.randn(2, 4, 1),
        ...             "done": torch.zeros(2, 4, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(2, 4, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [2, 4],
        ... )
        >>> loss = DreamerV3ModelLoss(WorldModel(), num_reward_bins=255)
        >>> losses, posterior = loss(sequences)
        >>> sum(v for k, v in losses.items() if k.startswith("loss_")).backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by DreamerV3ModelLoss, under ``"next"``."""

        reward: NestedKey = "reward"  # the real reward, then the decoded prediction, [*B, T, 1]
        reward_logits: NestedKey = "reward_logits"  # the two-hot reward logits, [*B, T, bins]
        true_reward: NestedKey = "true_reward"  # written: the real reward, moved aside, [*B, T, 1]
        prior_logits: NestedKey = "prior_logits"  # the prior's logits, [*B, T, cats, classes]
        posterior_logits: NestedKey = "posterior_logits"  # the posterior's, [*B, T, cats, classes]
        pixels: NestedKey = "pixels"  # observations [*B, T, C, H, W]: a key or a list
        reco_pixels: NestedKey = "reco_pixels"  # their reconstructions, [*B, T, C, H, W]
        continue_pred: NestedKey = "continue_pred"  # the continuation logit, [*B, T, 1]
        done: NestedKey = "done"  # the episode ends, [*B, T, 1]
        terminated: NestedKey = "terminated"  # the continuation target's zeros, [*B, T, 1]
    # checked at construction and on assignment (the lambda_* weights: by the base)
    _choices = {**WorldModelLossBase._choices, "kl_mode": KL_MODES, "reco_loss": ("l1", "l2")}
    kl_alpha = Coefficient(low=0.0, high=1.0)  # 1 - kl_alpha weighs the other KL term
    unimix = Coefficient(low=0.0, high=1.0, high_open=True)
    continue_target_scale = Coefficient(low=0.0, high=1.0, low_open=True)

    def __init__(
        self,
        world_model: nn.Module,
        *,
        lambda_kl: float = 1.0,
        lambda_reco: float = 1.0,
        lambda_reward: float = 1.0,
        lambda_continue: float = 0.0,
        kl_mode: str = "balanced",
        lambda_dynamic: float = 1.0,
        lambda_representation: float = 0.1,
        unimix: float = 0.0,
        continue_target_scale: float = 1.0,
        kl_alpha: float = 0.8,
        free_bits: float = 1.0,
        reco_loss: str = "l2",
        reco_symlog: bool | list[bool] = True,
        reward_two_hot: bool = True,
        num_reward_bins: int = 255,
        global_average: bool = False,
        detach_output: bool = True,
    ) -> None:
        check_choice("kl_mode", kl_mode, KL_MODES)
        check_choice("reco_loss", reco_loss, ("l1", "l2"))
        if not 0 < continue_target_scale <= 1:  # TorchRL's words
            raise ValueError("continue_target_scale must be in (0, 1].")
        DreamerV3ModelLoss.unimix.check(unimix)
        DreamerV3ModelLoss.kl_alpha.check(kl_alpha)
        weights = {"lambda_kl": lambda_kl, "lambda_reco": lambda_reco}
        weights.update(lambda_reward=lambda_reward, lambda_continue=lambda_continue)
        weights.update(lambda_dynamic=lambda_dynamic, lambda_representation=lambda_representation)
        super().__init__(world_model, global_average=global_average, **weights)
        self.kl_mode = kl_mode
        self._register_coefficients(
            unimix=unimix,
            kl_alpha=kl_alpha,
            continue_target_scale=continue_target_scale,
        )
        self.free_bits = free_bits  # any number: a floor of 0 or below clamps nothing
        self.reco_loss, self.reco_symlog = reco_loss, reco_symlog
        self.reward_two_hot, self.num_reward_bins = reward_two_hot, num_reward_bins
        self.detach_output = detach_output
        self.register_buffer("reward_bins", rlf.symexp_bins(num_reward_bins))

    def _kl_losses(self, output: TensorDictBase) -> dict[str, torch.Tensor]:
        posterior = self._get(output, "posterior_logits", nested=True)
        prior = self._get(output, "prior_logits", nested=True)
        if self.kl_mode == "balanced":
            kl = rlf.balanced_kl(posterior, prior, self.kl_alpha, self.free_bits)
            return {"loss_model_kl": self.lambda_kl * kl.mean().unsqueeze(-1)}
        dynamics, representation = rlf.dynamics_and_representation_kl(posterior, prior, self.unimix)
        dynamics = rlf.free_bits(dynamics.sum(-1), self.free_bits).mean().unsqueeze(-1)
        representation = rlf.free_bits(representation.sum(-1), self.free_bits).mean().unsqueeze(-1)
        weight = self.lambda_kl
        return {
            "loss_model_dynamic": weight * self.lambda_dynamic * dynamics,
            "loss_model_representation": weight * self.lambda_representation * representation,
        }

    def _reconstruction_loss(self, output: TensorDictBase) -> torch.Tensor:
        """``sum_heads mean(per-step error)``, ``[1]``."""
        targets, predictions = self._heads()
        use_symlog = self.reco_symlog
        if isinstance(use_symlog, bool):
            use_symlog = [use_symlog] * len(targets)
        if not targets or not len(targets) == len(predictions) == len(use_symlog):
            raise ValueError(
                "pixels, reco_pixels and reco_symlog must describe the same nonzero number of "
                f"reconstruction heads, got {len(targets)}, {len(predictions)} and "
                f"{len(use_symlog)}; set the keys with set_keys(pixels=[...], reco_pixels=[...])."
            )
        total = 0.0
        for target_key, prediction_key, transform in zip(
            targets, predictions, use_symlog, strict=True
        ):
            target = self._get_next(output, target_key, "pixels")
            prediction = self._get_next(output, prediction_key, "reco_pixels")
            error = reconstruction_error(target, prediction, self.reco_loss, transform)
            total = total + self._per_step(error, output.batch_size).mean().unsqueeze(-1)
        return self.lambda_reco * total

    def _reward_loss(self, output: TensorDictBase) -> torch.Tensor:
        true_reward = self._get(output, "true_reward", nested=True)
        if not self.reward_two_hot:
            prediction = self._get(output, "reward", nested=True)
            loss = rlf.symlog_squared_error(prediction, true_reward).squeeze(-1)
            return self.lambda_reward * loss.mean().unsqueeze(-1)
        logits = legacy_logits(self, output, "reward_logits", "reward", nested=True)
        if logits.shape[-1] != self.num_reward_bins:
            raise ValueError(
                f"reward_two_hot=True expects the reward head to output logits over "
                f"{self.num_reward_bins} bins, got trailing dim {logits.shape[-1]}."
            )
        loss = rlf.two_hot_cross_entropy(logits, true_reward, self.reward_bins)
        return self.lambda_reward * loss.mean().unsqueeze(-1)

    def _continue_loss(self, output: TensorDictBase) -> dict[str, torch.Tensor]:
        if not self.lambda_continue > 0:
            return {}
        logit = self._read(output, "continue_pred", nested=True)
        if logit is None:  # TorchRL drops the continuation loss silently
            key = next_key(self.tensor_keys.continue_pred)
            raise MissingKeyError(
                f"{type(self).__name__}: lambda_continue={self.lambda_continue} asks for the "
                f"continuation loss, but the world model's output has no {key!r} (tensor_keys."
                f"continue_pred); keys present: {list(output.keys(True, True))}. Make the world "
                "model write its continuation logit there (or remap it with "
                "set_keys(continue_pred=...)), or pass lambda_continue=0."
            )
        ended = self._read(output, "terminated", nested=True)
        if ended is None:
            ended = self._read(output, "done", nested=True)
        if ended is None:
            self._get(output, "terminated", nested=True)  # the missing-key error
        target = (~ended.bool()).to(logit.dtype) * self.continue_target_scale
        loss = F.binary_cross_entropy_with_logits(logit.squeeze(-1), target.squeeze(-1))
        return {"loss_model_continue": self.lambda_continue * loss.unsqueeze(-1)}

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> tuple[TensorDict, TensorDictBase]:
        """The losses and the world model's output (detached unless ``detach_output=False``)."""
        output = self._run_world_model(tensordict, ("reward",))
        out = {"loss_model_reco": self._reconstruction_loss(output)}
        out["loss_model_reward"] = self._reward_loss(output)
        out.update(self._kl_losses(output))
        out.update(self._continue_loss(output))
        return TensorDict(out), (output.data if self.detach_output else output)


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
