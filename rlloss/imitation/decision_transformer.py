"""Decision Transformers: ``DTLoss`` (Chen et al., "Decision Transformer: Reinforcement Learning
via Sequence Modeling", arXiv:2106.01345) and ``OnlineDTLoss`` (Zheng et al., "Online
Decision Transformer", arXiv:2202.05607)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.modules.distributions.utils import rsample_and_log_prob

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_choice, check_in_range
from rlloss._distribution_calls import DistributionCall
from rlloss._networks import NetworkCall, log_prob_of
from rlloss.common import accepts_tensor_arguments
from rlloss.functional.critic import DISTANCES
from rlloss.imitation.base import SupervisedLoss, check_target

SCALAR_OUTPUT_MODES = ("exclude", "non_tensor")


@dataclasses.dataclass
class _SequenceKeys:
    """Keys read by the Decision Transformer losses."""

    action_target: NestedKey = "action"  # the dataset's action, [*B, T, A]
    action_pred: NestedKey = "action"  # the actor's action (OnlineDTLoss: its spec's), [*B, T, A]


class _SequenceModelLoss(SupervisedLoss):
    """The actor of a Decision Transformer, its ``in_keys`` and ``actor_network_params``."""

    _AcceptedKeys = _SequenceKeys
    default_keys = _SequenceKeys

    def __init__(self, actor_network: nn.Module, reduction: str | None) -> None:
        super().__init__(reduction)
        self._register_networks(actor_network=actor_network)

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = {*self.actor_network.in_keys, *self._own_in_keys()}
        return sorted(keys, key=str)

    def _own_in_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.action_target]


class DTLoss(_SequenceModelLoss):
    r"""The Decision Transformer's loss: the actor, conditioned on returns-to-go, states and past
    actions, regresses the dataset's actions over every action element:

    $$
    \mathcal{L} = \frac{1}{N} \sum L(\hat{a}, a)
    $$

    ($L$: ``loss_function``, :func:`rlloss.functional.distance`; the paper's squared
    error for continuous actions, sec. 3).

    TorchRL's ``DTLoss`` with the same keywords, keys and output. The actor writes
    ``action_pred``; an actor that does not (whose prediction would be the batch's own
    action) raises. The batch's ``loss_mask_key`` masks (``("collector", "mask")`` of padded
    sequences) apply.

    Keys (``set_keys``): ``action_target`` (``"action"``), ``action_pred`` (``"action"``).

    Reference: Chen et al., "Decision Transformer: Reinforcement Learning via Sequence
    Modeling", arXiv:2106.01345.

    Args:
        actor_network: a TensorDict module writing ``action_pred`` (a deterministic or
            ``TanhDelta`` actor over a transformer).
        loss_function: ``"l2"`` (default), ``"l1"`` or ``"smooth_l1"``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        device: accepted for TorchRL's signature; the loss follows its actor's device.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from rlloss import DTLoss
        >>> # a transformer's head (here linear): the context, a state and its return-to-go
        >>> actor = TensorDictModule(
        ...     torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Tanh()), ["context"], ["action"]
        ... )  # the prediction replaces the action
        >>> trajectory_chunks = TensorDict(
        ...     context=torch.randn(4, 6, 4), action=torch.rand(4, 6, 2) * 2 - 1, batch_size=[4, 6]
        ... )
        >>> loss = DTLoss(actor)
        >>> loss(trajectory_chunks)["loss"].backward()
    """

    out_keys = ["loss"]
    _choices = {**_SequenceModelLoss._choices, "loss_function": DISTANCES}

    def __init__(
        self,
        actor_network: nn.Module,
        *,
        loss_function: str = "l2",
        reduction: str | None = None,
        device: torch.device | None = None,
    ) -> None:
        check_choice("loss_function", loss_function, DISTANCES)
        super().__init__(actor_network, reduction)
        self.loss_function = loss_function
        self._actor_call = NetworkCall(actor_network)

    def _own_in_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.action_pred, self.tensor_keys.action_target]

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``{"loss": ...}`` on a batch of (sequences of) states, returns-to-go and actions."""
        tensordict = self._without_padding(tensordict)
        target = self._get(tensordict, "action_target").detach()
        prediction = self._actor_call(tensordict).get(self.tensor_keys.action_pred, None)
        if prediction is None or prediction is self._read(tensordict, "action_pred"):
            raise RuntimeError(
                f"DTLoss: the actor did not write its prediction at "
                f"{self.tensor_keys.action_pred!r} (it writes "
                f"{list(getattr(self.actor_network, 'out_keys', []))}): the loss would compare "
                "the batch's action with itself. Make the actor's out_keys include it, or "
                "loss.set_keys(action_pred=<the actor's output key>)."
            )
        check_target("DTLoss", self.tensor_keys.action_target, target, prediction)
        loss = self._reduce_formula(
            rlf.distance, tensordict, prediction, target, self.loss_function
        )
        return TensorDict({"loss": loss}, batch_size=[])


class OnlineDTLoss(_SequenceModelLoss):
    r"""The Online Decision Transformer's loss: a stochastic actor maximises the likelihood of
    the dataset's actions and an entropy bonus with a learned temperature (Zheng et al.,
    arXiv:2202.05607, eq. 5-7):

    $$
    \mathcal{L}_{\text{log\_likelihood}} = -\log \pi(a \mid s), \qquad
    \mathcal{L}_{\text{entropy}} = -\alpha H[\pi(\cdot \mid s)], \qquad
    \mathcal{L}_{\text{alpha}} = \alpha (H - \bar{H})
    $$

    - ``loss_log_likelihood = -log pi(a|s)``;
    - ``loss_entropy = -alpha H[pi(.|s)]``, ``H`` a Monte-Carlo estimate over
      ``samples_mc_entropy`` reparameterised draws (``alpha`` without gradient);
    - ``loss_alpha = alpha (H - H_target)`` (only ``log_alpha`` gets gradient; SAC's
      temperature loss with ``log pi = -H``, :func:`rlloss.functional.alpha_temperature_loss`);
    - ``alpha`` and ``entropy`` (the batch mean of ``H``), detached.

    TorchRL's ``OnlineDTLoss`` with the same keywords, keys, buffers (``log_alpha``,
    ``alpha_init``, ``target_entropy``, ``min_log_alpha``, ``max_log_alpha``) and outputs.
    With ``reduction="none"`` the output has the batch's size and holds the three losses
    (``alpha`` and ``entropy`` as non-tensor entries with ``scalar_output_mode="non_tensor"``).

    Keys (``set_keys``): ``action_target`` (``"action"``), ``action_pred`` (``"action"``: the
    actor's spec entry ``target_entropy="auto"`` reads).

    Args:
        actor_network: a ``ProbabilisticActor`` (with a ``spec`` for ``target_entropy="auto"``).
        alpha_init: the initial temperature, > 0 (default 1.0).
        min_alpha: bounds of ``alpha`` (default ``None``); one alone bounds one side
            (TorchRL's rule: the other becomes 0 or 1e9; a bound of 0 is no bound).
        max_alpha: as ``min_alpha``.
        fixed_alpha: keep ``alpha`` at ``alpha_init`` (a buffer, not a parameter).
        target_entropy: ``H_target``, or ``"auto"``: ``-dim(A)`` from the actor's spec.
        samples_mc_entropy: draws of the entropy estimate, >= 1 (default 1).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        scalar_output_mode: with ``reduction="none"``: ``"exclude"`` (default, with TorchRL's
            warning when not given) or ``"non_tensor"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import ProbabilisticActor, TanhNormal
        >>> from rlloss import OnlineDTLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(
        ...         torch.nn.Sequential(torch.nn.Linear(4, 4), NormalParamExtractor()),
        ...         ["context"],
        ...         ["loc", "scale"],
        ...     ),
        ...     ["loc", "scale"],
        ...     distribution_class=TanhNormal,
        ...     spec=Bounded(-1, 1, (2,)),
        ... )
        >>> trajectory_chunks = TensorDict(
        ...     context=torch.randn(4, 6, 4), action=torch.rand(4, 6, 2) * 2 - 1, batch_size=[4, 6]
        ... )
        >>> loss = OnlineDTLoss(actor, target_entropy="auto")
        >>> out = loss(trajectory_chunks)
        >>> (out["loss_log_likelihood"] + out["loss_entropy"] + out["loss_alpha"]).backward()
    """

    out_keys = ["loss_log_likelihood", "loss_entropy", "loss_alpha", "alpha", "entropy"]
    target_entropy = Coefficient(finite=True, buffer=True)  # a later number: written in place
    samples_mc_entropy = Coefficient(low=1, integer=True)

    def __init__(
        self,
        actor_network: nn.Module,
        *,
        alpha_init: float = 1.0,
        min_alpha: float | None = None,
        max_alpha: float | None = None,
        fixed_alpha: bool = False,
        target_entropy: str | float = "auto",
        samples_mc_entropy: int = 1,
        reduction: str | None = None,
        scalar_output_mode: str | None = None,
    ) -> None:
        check_in_range("alpha_init", alpha_init, 0.0, low_open=True)
        OnlineDTLoss.samples_mc_entropy.check(samples_mc_entropy)
        super().__init__(actor_network, reduction)
        device = next(iter(actor_network.parameters()), torch.empty(0)).device
        self._register_temperature(alpha_init, min_alpha, max_alpha, fixed_alpha, device)
        if isinstance(target_entropy, str):
            check_choice("target_entropy", target_entropy, ("auto",))
            target_entropy = self._auto_target_entropy(actor_network)
        self._register_coefficients(
            device=device, target_entropy=target_entropy, samples_mc_entropy=samples_mc_entropy
        )
        mode = self._scalar_output_mode(scalar_output_mode)
        self.scalar_output_mode = _warn_unreduced_scalars(self, mode)
        self._actor_call = DistributionCall(actor_network)

    def _register_temperature(self, alpha_init, min_alpha, max_alpha, fixed_alpha, device):
        """``alpha_init``, ``log_alpha`` (a parameter, or a buffer when fixed) and the bounds'
        logs (buffers, ``None`` when unbounded), as TorchRL's."""
        self.register_buffer("alpha_init", torch.tensor(float(alpha_init), device=device))
        for name, bound in (("min_alpha", min_alpha), ("max_alpha", max_alpha)):
            if bound is not None:  # 0 (or None): that side unbounded, as TorchRL's
                check_in_range(name, bound, 0.0)
        if min_alpha and max_alpha:
            check_in_range("max_alpha", max_alpha, min_alpha)
        if bool(min_alpha) ^ bool(max_alpha):  # TorchRL's rule for one bound given
            if max_alpha == 0:
                raise ValueError("max_alpha must be either None or greater than 0.")
            min_alpha, max_alpha = min_alpha or 0.0, max_alpha or 1e9
        for name, bound in (("min_log_alpha", min_alpha), ("max_log_alpha", max_alpha)):
            if bound:
                self.register_buffer(name, torch.tensor(float(bound), device=device).log())
            else:
                setattr(self, name, None)
        log_alpha = torch.tensor(math.log(alpha_init), device=device)
        self.fixed_alpha = bool(fixed_alpha)
        if self.fixed_alpha:
            self.register_buffer("log_alpha", log_alpha)
        else:
            self.log_alpha = nn.Parameter(log_alpha)

    def _auto_target_entropy(self, actor_network: nn.Module) -> float:
        """``-dim(A)``: minus the number of elements of one action of the actor's spec."""
        spec, key = getattr(actor_network, "spec", None), self.tensor_keys.action_pred
        if spec is None or spec.get(key, None) is None:
            raise RuntimeError(
                "OnlineDTLoss: cannot infer the dimensionality of the action for "
                "target_entropy='auto': the actor has no spec. Give target_entropy=<a number> "
                "or build the actor with the action's spec (ProbabilisticActor(..., spec=...))."
            )
        container = spec[key[:-1]].shape if isinstance(key, tuple) else spec.shape
        return -float(spec[key].shape[len(container) :].numel())

    @staticmethod
    def _scalar_output_mode(mode: str | None) -> str | None:
        if mode is not None:
            check_choice("scalar_output_mode", mode, SCALAR_OUTPUT_MODES)
        return mode

    def _clamped_log_alpha(self) -> torch.Tensor:
        """``log_alpha``, clamped in place into its bounds first (TorchRL's ``alpha``)."""
        if self.min_log_alpha is not None or self.max_log_alpha is not None:
            with torch.no_grad():
                self.log_alpha.clamp_(self.min_log_alpha, self.max_log_alpha)
        return self.log_alpha

    @property
    def alpha(self) -> torch.Tensor:
        """The temperature ``exp(log_alpha)`` (after the clamp), without gradient."""
        return self._clamped_log_alpha().detach().exp()

    def get_entropy_bonus(self, distribution) -> torch.Tensor:
        """``H[pi(.|s)]`` estimated as ``-mean_k log pi(a_k|s)`` over ``samples_mc_entropy``
        reparameterised draws ``a_k``: ``[*B]``."""
        _, log_prob = rsample_and_log_prob(distribution, (self.samples_mc_entropy,))
        return -log_prob.mean(0)

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The three losses and the diagnostics on a batch of (sequences of) states,
        returns-to-go and actions."""
        tensordict = self._without_padding(tensordict)
        target = self._get(tensordict, "action_target")
        if target.requires_grad:
            raise RuntimeError(
                "OnlineDTLoss: the target action cannot be part of a graph: store the "
                "dataset's actions detached (action.detach())."
            )
        distribution = self._actor_call(tensordict)
        log_prob = log_prob_of(distribution, target, self.tensor_keys.action_target, "OnlineDTLoss")
        entropy = self.get_entropy_bonus(distribution)
        log_alpha = self._clamped_log_alpha()
        alpha = log_alpha.detach().exp()
        out = {
            "loss_log_likelihood": rlf.bc_negative_log_likelihood(log_prob),
            "loss_entropy": -alpha * entropy,
            "loss_alpha": rlf.alpha_temperature_loss(
                log_alpha.exp(), -entropy, self.target_entropy
            ),
        }
        if self.reduction == "none":
            return self._unreduced(out, tensordict, alpha, entropy)
        out = {key: self._reduce_valid(value, tensordict) for key, value in out.items()}
        out["entropy"] = self._valid_mean(entropy.detach(), tensordict)  # TorchRL's: padding too
        out["alpha"] = alpha
        return TensorDict(out, batch_size=[])

    def _unreduced(self, out: dict, batch: TensorDictBase, alpha, entropy) -> TensorDictBase:
        """The per-element losses in a TensorDict of the batch's size (TorchRL's output)."""
        result = TensorDict(out, batch_size=batch.batch_size)
        if self.scalar_output_mode == "non_tensor":
            result.set_non_tensor("alpha", alpha)
            result.set_non_tensor("entropy", self._valid_mean(entropy.detach(), batch))
        return result


def _warn_unreduced_scalars(loss: OnlineDTLoss, mode: str | None) -> str | None:
    """TorchRL's warning for ``reduction="none"`` without ``scalar_output_mode``."""
    if loss.reduction == "none" and mode is None:
        warnings.warn(
            "OnlineDTLoss with reduction='none' cannot include scalar values (alpha, entropy) "
            "in the output TensorDict without changing their shape. These values will be "
            "excluded from the output; read alpha as loss_module.alpha. To silence this "
            "warning, pass scalar_output_mode='exclude' (or 'non_tensor' to include them as "
            "non-tensor data).",
            category=UserWarning,
            stacklevel=3,
        )
        return "exclude"
    return mode
