"""``BCLoss``: behaviour cloning from demonstrations (Pomerleau, "ALVINN", 1989; Bain & Sammut,
1995; as a loss module, Goecks et al., arXiv:1910.04281)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._checks import ChoicesOr
from rlloss._data_checks import checks_enabled
from rlloss._distribution_calls import DistributionCall
from rlloss._networks import NetworkCall, log_prob_of
from rlloss.common import accepts_tensor_arguments
from rlloss.imitation.base import SupervisedLoss, check_target, zero_padded

LOSS_FUNCTIONS = ("l1", "l2", "mse", "smooth_l1", "cross_entropy")
DISTRIBUTION_KEYS = ("loc", "scale", "logits", "probs")


class BCLoss(SupervisedLoss):
    r"""Behaviour cloning: the actor's prediction against the demonstrated action ``a*``.

    $$
    \mathcal{L}_{\text{bc}} = \frac{1}{N} \sum \ell\big(\hat{a}(s), a^*\big)
    \quad \text{or} \quad
    \mathcal{L}_{\text{bc}} = -\frac{1}{N} \sum \log \pi(a^* \mid s)
    $$

    ``loss_bc`` is, elementwise before the reduction (:func:`rlloss.functional.action_error`):

    - with ``loss_function`` (``"l1"``, ``"l2"`` / ``"mse"``, ``"smooth_l1"``,
      ``"cross_entropy"`` or a callable ``f(prediction, target)``): that error of the actor's
      output at ``tensor_keys.action`` against the batch's;
    - without: the cross-entropy of the actor's logits for integer actions, ``-log pi(a*|s)``
      for an actor that writes distribution parameters (``loc``, ``scale``, ``logits`` or
      ``probs``: :func:`rlloss.functional.bc_negative_log_likelihood`), the squared error for
      a deterministic one.

    The same formulas as the :class:`rlloss.BehaviorCloning` add-on, which adds them to the
    actor loss of an RL loss. TorchRL's ``BCLoss`` with the same keywords, keys and output.

    The actor writes its prediction at ``tensor_keys.action`` (which also holds ``a*`` in the
    batch); an actor writing ``"action"`` while the key is another one is read there with a
    ``FutureWarning`` (TorchRL's, until its v0.16); one writing neither raises.

    Keys (``set_keys``): ``action`` (default ``"action"``); ``pad_mask`` (default ``None``): a
    boolean entry, ``True`` on padded elements (e.g. the padded steps ``[*B, H]`` of an action
    chunk ``[*B, H, D]``), left out of the loss. The batch's ``loss_mask_key`` masks (TorchRL's
    ``("collector", "mask")``...) apply too.

    Reference: Pomerleau, "ALVINN: An Autonomous Land Vehicle in a Neural Network", NeurIPS 1988;
    Bain and Sammut, "A Framework for Behavioural Cloning", Machine Intelligence 15 (1995).

    Args:
        actor_network: a TensorDict module (TorchRL ``Actor``, ``ProbabilisticActor``...).
        loss_function: see above (default ``None``: chosen from the actor and the action).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``; with a padding mask,
            ``"none"`` gives the valid elements flat (TorchRL's convention, a host sync).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from rlloss import BCLoss
        >>> actor = TensorDictModule(
        ...     torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh()),
        ...     ["observation"],
        ...     [("vla_action", "chunk")],
        ... )
        >>> demonstrations = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         ("vla_action", "chunk"): torch.rand(8, 2) * 2 - 1,
        ...         "action_is_pad": torch.zeros(8, 2, dtype=torch.bool),
        ...     },
        ...     [8],
        ... )
        >>> loss = BCLoss(actor, loss_function="l1")
        >>> loss.set_keys(action=("vla_action", "chunk"), pad_mask="action_is_pad")
        >>> loss(demonstrations)["loss_bc"].backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by BCLoss."""

        action: NestedKey = "action"  # the demonstrated action, and the actor's prediction, [*B, D]
        pad_mask: NestedKey | None = None  # True where padded, [*B, H] of a chunk [*B, H, D]

    out_keys = ["loss_bc"]
    _choices = {  # checked on assignment as at construction
        **SupervisedLoss._choices,
        "loss_function": ChoicesOr(
            LOSS_FUNCTIONS,
            lambda value: value is None or callable(value),
            ", a callable f(prediction, target), or None",
        ),
    }

    def __init__(
        self,
        actor_network: nn.Module,
        *,
        loss_function: str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        reduction: str | None = None,
    ) -> None:
        super().__init__(reduction)
        if not (loss_function is None or callable(loss_function)):
            if loss_function not in LOSS_FUNCTIONS:
                raise ValueError(
                    f"Unsupported loss_function: {loss_function!r}; BCLoss takes one of "
                    f"{LOSS_FUNCTIONS}, a callable f(prediction, target), or None."
                )
        self._register_networks(actor_network=actor_network)
        self.loss_function = loss_function
        out_keys = list(getattr(actor_network, "out_keys", []))
        self._stochastic = any(_compat.unravel_key(k)[-1] in DISTRIBUTION_KEYS for k in out_keys)
        self._actor_call = NetworkCall(actor_network)
        self._distribution_call = DistributionCall(actor_network) if self._stochastic else None

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = [self.tensor_keys.action, *self.actor_network.in_keys]
        if self.tensor_keys.pad_mask is not None:
            keys.append(self.tensor_keys.pad_mask)
        return list(dict.fromkeys(keys))

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``{"loss_bc": ...}`` on a batch of observations and demonstrated actions."""
        tensordict = self._without_padding(tensordict)
        expert = self._get(tensordict, "action")
        kind = self._kind(expert)
        pad = self._pad(tensordict)
        if pad is not None and pad.ndim <= expert.ndim:
            expert = zero_padded(expert, pad)  # no NaN of a padded element in the gradient
        if isinstance(kind, str) and pad is None:  # reduced by the formula when nothing masks
            prediction = self._checked_prediction(tensordict, expert)
            loss = self._reduce_formula(self._action_error, tensordict, prediction, expert, kind)
        else:
            loss = self._elementwise_loss(tensordict, expert, kind)
            loss = self._reduce_valid(loss, tensordict, self._valid(pad, loss))
        return TensorDict({"loss_bc": loss}, batch_size=[])

    def _kind(self, expert: torch.Tensor):
        """The error to take: ``loss_function``, else the cross-entropy for integer actions,
        ``None`` (the negative log-likelihood) for a stochastic actor, the squared error."""
        if self.loss_function is not None:
            return self.loss_function
        if expert.dtype in (torch.int32, torch.int64):
            return "cross_entropy"
        return None if self._stochastic else "l2"

    def _checked_prediction(self, batch: TensorDictBase, expert: torch.Tensor) -> torch.Tensor:
        """The actor's action for ``batch``, checked against a floating demonstrated action."""
        prediction = self._prediction(batch, expert)
        if expert.is_floating_point():
            check_target("BCLoss", self.tensor_keys.action, expert, prediction)
        return prediction

    def _elementwise_loss(self, batch: TensorDictBase, expert: torch.Tensor, kind):
        if kind is None:
            distribution = self._distribution_call(batch)
            log_prob = log_prob_of(distribution, expert, self.tensor_keys.action, "BCLoss")
            return rlf.bc_negative_log_likelihood(log_prob)
        prediction = self._checked_prediction(batch, expert)
        if callable(kind):
            return kind(prediction, expert)
        return self._action_error(prediction, expert, kind)

    def _action_error(
        self, prediction: torch.Tensor, expert: torch.Tensor, kind: str, reduction: str = "none"
    ) -> torch.Tensor:
        """:func:`rlloss.functional.action_error`; class indices outside the actor's outputs
        raise a ``ValueError`` naming the entry (found by the cross-entropy's own range check on
        the CPU, no host sync; on an accelerator, which asserts instead, by a check that runs
        with :func:`rlloss.set_checks`)."""
        if kind == "cross_entropy" and checks_enabled():
            check_class_indices("BCLoss", self.tensor_keys.action, expert, prediction.shape[-1])
        try:
            return rlf.action_error(prediction, expert, kind, reduction)
        except IndexError:
            check_class_indices("BCLoss", self.tensor_keys.action, expert, prediction.shape[-1])
            raise

    def _prediction(self, batch: TensorDictBase, expert: torch.Tensor) -> torch.Tensor:
        """The actor's output at ``tensor_keys.action`` (or, with TorchRL's warning, at
        ``"action"``)."""
        outputs = self._actor_call(batch)
        key = self.tensor_keys.action
        prediction = outputs.get(key, None)
        if prediction is not None and prediction is not expert:
            return prediction
        legacy = outputs.get("action", None)
        if legacy is not None and legacy is not expert and key != "action":
            warnings.warn(
                f"The actor wrote its prediction at 'action' while the loss's action key is "
                f"{key!r}. Reading the prediction from the hardcoded 'action' key is deprecated "
                "(TorchRL removes it in v0.16): make the actor's out_keys match the loss's "
                "action key.",
                FutureWarning,
                stacklevel=4,
            )
            return legacy
        raise RuntimeError(
            f"BCLoss: the actor did not write a prediction at {key!r} (it writes "
            f"{list(getattr(self.actor_network, 'out_keys', []))}): make sure the actor's "
            "out_keys match the loss's action key (loss.set_keys(action=...))."
        )

    def _pad(self, batch: TensorDictBase) -> torch.Tensor | None:
        """The ``pad_mask`` entry when the key is set and the batch holds it."""
        key = self.tensor_keys.pad_mask
        return None if key is None else batch.get(key, None)

    def _valid(self, pad: torch.Tensor | None, loss: torch.Tensor) -> torch.Tensor | None:
        """``~pad`` (checked against the loss's dims)."""
        if pad is None:
            return None
        key = self.tensor_keys.pad_mask
        if pad.ndim > loss.ndim:
            raise RuntimeError(
                f"BCLoss: pad_mask {key!r} has more dimensions ({pad.ndim}, shape "
                f"{tuple(pad.shape)}) than the computed loss ({loss.ndim}, shape "
                f"{tuple(loss.shape)}): per-element masking requires an elementwise loss "
                "(e.g. loss_function='l1'), not a distribution-based (NLL) or cross-entropy loss."
            )
        return ~pad


def check_class_indices(owner: str, key, index: torch.Tensor, classes: int) -> None:
    """Refuse integer class indices (``index``) outside ``[0, classes)``, naming the entry, the
    range and the values found. Reads the tensor: called on an error path, or with
    :func:`rlloss.set_checks` on."""
    low, high = int(index.min()), int(index.max())
    if low < 0 or high >= classes:
        raise ValueError(
            f"{owner}: the entry {key!r} holds action indices from {low} to {high}, but the "
            f"network gives {classes} actions (logits of size {classes}), so indices must lie "
            f"in [0, {classes}). Store the index of the action taken, or give the network one "
            "output per action."
        )
