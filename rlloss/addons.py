"""Policy-loss add-ons: extra terms on the actor loss of any actor-critic loss.

PyTorchRL (Bou et al., "PyTorchRL: Modular and Distributed Reinforcement Learning in PyTorch",
arXiv:2007.02622) lets every algorithm take ``policy_loss_addons``, a list of objects that each
add a term to the policy loss. rlloss does the same: every loss with an actor loss (the PPO
family, A2C, REINFORCE, SAC, discrete SAC, CQL, TQC, REDQ, DDPG, TD3, TD3+BC, IQL, MPO) accepts
``policy_loss_addons=[...]``. An add-on is an ``nn.Module`` whose ``forward(batch, actor)``
returns a per-sample term ``[*B]`` (its coefficient included) from the batch and the actor's
output on it (:class:`ActorOutput`). The loss reduces each term as it reduces its actor loss
(``reduction``, padding masks, prioritized-replay weights), adds it to the actor loss
(``loss_objective`` for the PPO family and A2C, ``loss_actor`` otherwise), and reports its
detached value as ``addon_<name>``: a diagnostic, not a ``loss_*`` entry, so summing the
``loss_*`` entries still gives the training objective (the term is counted once, inside the
actor loss). Calling the actor loss alone (``loss.loss_actor(batch)``, TD3's delayed updates)
includes the terms too.

Two add-ons are provided: :class:`BehaviorCloning` (``-log pi(a*|s)`` or the squared error of
the policy's action against dataset or expert actions) and :class:`AttractionKL` (a KL towards a
frozen prior policy, PyTorchRL's ``AttractionKL``). A new add-on subclasses
:class:`PolicyLossAddon` and implements :meth:`PolicyLossAddon.term`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase
from tensordict.nn import CompositeDistribution, ProbabilisticTensorDictModule
from tensordict.utils import NestedKey
from torch import distributions as D
from torch import nn

from rlloss import functional as rlf
from rlloss._checks import (
    Coefficient,
    CoefficientOwner,
    MissingKeyError,
    check_choice,
    check_network,
)
from rlloss._distribution_calls import DistributionCall
from rlloss._ensembles import frozen_copy
from rlloss._networks import NetworkCall, action_log_prob

ADDON_PREFIX = "addon_"
BC_MODES = ("auto", "log_likelihood", "squared_error")
KL_DIRECTIONS = ("prior_to_policy", "policy_to_prior")


class ActorOutput:
    """The actor's output on a batch, as the actor loss computed it.

    Attributes:
        action: the actor's own action at the batch's states, ``[*B, D]`` with gradient: ``mu(s)``
            of a deterministic actor (DDPG, TD3), the reparameterised sample ``a~`` of the SAC
            family; ``None`` where the loss draws none (PPO, A2C, IQL, MPO).
        distribution: ``pi(.|s)`` (built on first access when the loss did not need it),
            ``None`` for a deterministic actor.
        action_key: the loss's key of the batch's action (``tensor_keys.action``, following
            ``set_keys``), ``None`` for a loss without one; set by the loss.
    """

    def __init__(
        self,
        *,
        action: torch.Tensor | None = None,
        distribution: D.Distribution | Callable[[], D.Distribution] | None = None,
    ) -> None:
        self.action = action
        self._distribution = distribution
        self.action_key: NestedKey | list | None = None

    @property
    def deterministic(self) -> bool:
        return self._distribution is None

    @property
    def distribution(self) -> D.Distribution | None:
        if callable(self._distribution) and not isinstance(self._distribution, D.Distribution):
            self._distribution = self._distribution()
        return self._distribution


class PolicyLossAddon(CoefficientOwner, nn.Module):
    """Base of the add-ons: a coefficient (a buffer, ``addon.coefficient = x`` is checked and
    a number is written in place, so a schedule does not recompile a compiled loss) times a
    per-sample :meth:`term`.

    Args:
        coefficient: the term's weight, >= 0.
        name: the output entry is ``addon_<name>``; distinct among a loss's add-ons.
    """

    coefficient = Coefficient(low=0.0, buffer=True)

    def __init__(self, coefficient: float, name: str) -> None:
        super().__init__()
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"{type(self).__name__}: name must be a non-empty string, got {name!r}."
            )
        self._register_coefficients(coefficient=coefficient)
        self.name = name

    @property
    def out_key(self) -> str:
        """The entry reporting the term: ``addon_<name>``."""
        return f"{ADDON_PREFIX}{self.name}"

    @property
    def in_keys(self) -> list[NestedKey]:
        """Batch entries the add-on reads besides what the loss reads."""
        return []

    def check_actor(self, owner: str, deterministic: bool) -> None:
        """Refuse, at the loss's construction, an actor this add-on cannot work with."""

    def term(self, batch: TensorDictBase, actor: ActorOutput) -> torch.Tensor:
        """The per-sample term ``[*B]`` before the coefficient."""
        raise NotImplementedError(f"{type(self).__name__} must implement term(batch, actor).")

    def forward(self, batch: TensorDictBase, actor: ActorOutput) -> torch.Tensor:
        """``coefficient * term``, ``[*B]``."""
        return self.coefficient * self.term(batch, actor)

    def _entry(self, batch: TensorDictBase, key: NestedKey, argument: str) -> torch.Tensor:
        value = batch.get(key, None)
        if value is None:
            present = sorted(str(k) for k in batch.keys(include_nested=True, leaves_only=True))
            raise MissingKeyError(
                f"{type(self).__name__} (policy-loss add-on {self.name!r}) reads the entry "
                f"{key!r}, which the batch lacks. Entries present: {present}. Store it in the "
                f"batch, or pass {type(self).__name__}({argument}=<your key>)."
            )
        return value

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


class BehaviorCloning(PolicyLossAddon):
    """Behaviour cloning towards dataset or expert actions ``a*`` (the batch's ``action_key``).

    - ``"log_likelihood"``: ``-log pi(a*|s)`` under the current policy (summed over the heads
      of a composite action);
    - ``"squared_error"``: ``1/D sum_d (a_d - a*_d)^2`` with ``a`` the actor's action
      (:attr:`ActorOutput.action`: ``mu(s)``, SAC's ``a~``), or the distribution's
      deterministic sample (its mode or mean) where the loss draws none
      (:func:`rlloss.functional.action_squared_error`);
    - ``"auto"`` (default): the log-likelihood for a stochastic actor, the squared error for a
      deterministic one.

    Args:
        coefficient: the weight, >= 0 (default 1.0).
        action_key: the batch entry holding ``a*``; default ``None``: the loss's action entry
            (``tensor_keys.action``, the dataset's action in offline RL); e.g.
            ``("expert", "action")`` for demonstrations stored beside the collected actions.
        mode: ``"auto"``, ``"log_likelihood"`` or ``"squared_error"``.
        name: the output entry is ``addon_<name>`` (default ``addon_behavior_cloning``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
        >>> from rlloss import BehaviorCloning, SACLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(
        ...         torch.nn.Sequential(torch.nn.Linear(3, 2), NormalParamExtractor()),
        ...         ["observation"],
        ...         ["loc", "scale"],
        ...     ),
        ...     ["loc", "scale"],
        ...     distribution_class=TanhNormal,
        ... )
        >>> qvalue = ValueOperator(
        ...     MLP(in_features=4, out_features=1, num_cells=[8]), in_keys=["observation", "action"]
        ... )
        >>> batch = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 3),
        ...         "action": torch.rand(8, 1) * 2 - 1,
        ...         "next": {
        ...             "observation": torch.randn(8, 3),
        ...             "reward": torch.randn(8, 1),
        ...             "done": torch.zeros(8, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(8, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [8],
        ... )
        >>> batch["expert", "action"] = torch.rand(8, 1) * 2 - 1  # a demonstrator's actions
        >>> bc = BehaviorCloning(coefficient=0.1, action_key=("expert", "action"))
        >>> loss = SACLoss(actor, qvalue, policy_loss_addons=[bc], action_spec=Bounded(-1, 1, (1,)))
        >>> out = loss(batch)  # out["loss_actor"] includes 0.1 * mean(-log pi(a*|s))
        >>> print(out["addon_behavior_cloning"])
    """

    def __init__(
        self,
        coefficient: float = 1.0,
        *,
        action_key: NestedKey | None = None,
        mode: str = "auto",
        name: str = "behavior_cloning",
    ) -> None:
        super().__init__(coefficient, name)
        check_choice("mode", mode, BC_MODES)
        self.action_key = action_key
        self.mode = mode

    @property
    def in_keys(self) -> list[NestedKey]:
        return [] if self.action_key is None else [self.action_key]

    def check_actor(self, owner: str, deterministic: bool) -> None:
        if deterministic and self.mode == "log_likelihood":
            raise ValueError(
                f"{owner}: BehaviorCloning(mode='log_likelihood') needs a stochastic actor, and "
                f"{owner}'s actor is deterministic; use mode='squared_error' (or 'auto')."
            )

    def term(self, batch: TensorDictBase, actor: ActorOutput) -> torch.Tensor:
        key = actor.action_key if self.action_key is None else self.action_key
        if key is None:
            raise ValueError(
                f"BehaviorCloning ({self.name!r}): the loss has no action entry; pass "
                "BehaviorCloning(action_key=<the key of the dataset's actions>)."
            )
        if self.mode == "log_likelihood" or (self.mode == "auto" and not actor.deterministic):
            for one_key in key if isinstance(key, list) else [key]:
                self._entry(batch, one_key, "action_key")
            owner = f"BehaviorCloning ({self.name!r})"
            log_prob = action_log_prob(actor.distribution, batch, key, owner)
            return rlf.bc_negative_log_likelihood(log_prob)  # BCLoss's formula
        target = self._entry(batch, key, "action_key")
        action = actor.action if actor.action is not None else _mode(actor.distribution)
        return rlf.action_squared_error(action, target)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, action_key={self.action_key!r}, mode={self.mode!r}"


class AttractionKL(PolicyLossAddon):
    """A KL divergence between a frozen prior policy and the current policy, per state.

    ``direction="prior_to_policy"`` (default, PyTorchRL's ``AttractionKL``):
    ``KL(pi_prior(.|s) || pi(.|s))``, mass-covering (the policy keeps every action the prior
    takes); ``"policy_to_prior"``: ``KL(pi(.|s) || pi_prior(.|s))``, the KL-regularised-RL
    penalty (mode-seeking). Closed form for (independent) Gaussians and categoricals
    (:func:`rlloss.functional.kl_divergence`), else a Monte-Carlo estimate over ``samples``
    draws (reparameterised when drawn from the trained policy). A deterministic policy or prior
    is read as a unit-variance Gaussian around its action, as PyTorchRL does (two deterministic
    ones give ``1/2 |a - a_prior|^2``, :func:`rlloss.functional.unit_gaussian_kl`).

    The prior is copied at construction and frozen (its weights become buffers: they appear in
    the loss's ``state_dict``, never in its ``parameters()``, and move with ``.to()``); it runs
    under ``torch.no_grad()``.

    Args:
        prior: a TorchRL ``ProbabilisticActor`` or a deterministic actor (writing
            ``prior_action_key``), reading the batch's observations.
        coefficient: the weight, >= 0 (default 1.0).
        direction: ``"prior_to_policy"`` or ``"policy_to_prior"``.
        samples: draws of the Monte-Carlo estimate, >= 1 (default 1).
        prior_action_key: the output of a deterministic prior (default ``"action"``).
        name: the output entry is ``addon_<name>`` (default ``addon_attraction_kl``).

    Differences from PyTorchRL: one prior per add-on (PyTorchRL takes several with weights and
    keeps the smallest of ``KL_i - log w_i``: give one add-on per prior to sum them instead); the
    KL is per sample and reduced by the loss (PyTorchRL takes its batch mean).

    Examples:
        >>> import copy
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor, ValueOperator
        >>> from rlloss import AttractionKL, ClipPPOLoss
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
        ...     ["logits"],
        ...     distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True,
        ... )
        >>> critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        >>> rollout = TensorDict(
        ...     {
        ...         "observation": torch.randn(4, 16, 3),
        ...         "action": torch.randint(2, (4, 16)),
        ...         "action_log_prob": torch.full((4, 16), -0.69),
        ...         "next": {
        ...             "observation": torch.randn(4, 16, 3),
        ...             "reward": torch.randn(4, 16, 1),
        ...             "done": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...             "terminated": torch.zeros(4, 16, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     [4, 16],
        ... )  # [num_envs, T]
        >>> prior = copy.deepcopy(actor)  # e.g. a pretrained policy
        >>> loss = ClipPPOLoss(actor, critic, policy_loss_addons=[AttractionKL(prior, 0.05)])
        >>> out = loss(rollout)  # out["loss_objective"] includes 0.05 * KL(pi || prior)
        >>> print(out["addon_attraction_kl"])
    """

    samples = Coefficient(low=1, integer=True)  # checked on assignment too

    def __init__(
        self,
        prior: nn.Module,
        coefficient: float = 1.0,
        *,
        direction: str = "prior_to_policy",
        samples: int = 1,
        prior_action_key: NestedKey = "action",
        name: str = "attraction_kl",
    ) -> None:
        super().__init__(coefficient, name)
        check_network("AttractionKL", "prior", prior)
        check_choice("direction", direction, KL_DIRECTIONS)
        self._register_coefficients(samples=samples)
        self.direction = direction
        self.prior_action_key = prior_action_key
        self.prior = frozen_copy(prior)
        self._stochastic_prior = any(
            isinstance(module, ProbabilisticTensorDictModule) for module in self.prior.modules()
        )
        self._prior_call = (
            DistributionCall(self.prior)
            if self._stochastic_prior
            else NetworkCall(self.prior, until=prior_action_key)
        )

    @property
    def in_keys(self) -> list[NestedKey]:
        return list(self.prior.in_keys)

    def _prior(self, batch: TensorDictBase) -> D.Distribution | torch.Tensor:
        with torch.no_grad():
            if self._stochastic_prior:
                return self._prior_call(batch)
            return self._prior_call(batch)[self.prior_action_key]

    def term(self, batch: TensorDictBase, actor: ActorOutput) -> torch.Tensor:
        prior = self._prior(batch)
        policy = actor.action if actor.deterministic else actor.distribution
        _check_same_actions(policy, prior, self.prior_action_key)
        if isinstance(policy, torch.Tensor) and isinstance(prior, torch.Tensor):
            return rlf.unit_gaussian_kl(policy, prior)
        policy, prior = _as_distribution(policy), _as_distribution(prior)
        if self.direction == "prior_to_policy":
            return rlf.kl_divergence(prior, policy, self.samples)
        return rlf.kl_divergence(policy, prior, self.samples, reparameterized=True)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, direction={self.direction!r}, samples={self.samples}"


def _action_shape(policy: D.Distribution | torch.Tensor) -> tuple[int, ...] | None:
    """``[*B, A]`` of an action tensor or a distribution (``None`` when it does not say)."""
    if isinstance(policy, torch.Tensor):
        return tuple(policy.shape)
    batch_shape, event_shape = (getattr(policy, a, None) for a in ("batch_shape", "event_shape"))
    return None if batch_shape is None or event_shape is None else (*batch_shape, *event_shape)


def _check_same_actions(policy, prior, prior_action_key: NestedKey) -> None:
    """The policy and the prior act in the same space (a shape check: no host sync)."""
    policy_shape, prior_shape = _action_shape(policy), _action_shape(prior)
    if None not in (policy_shape, prior_shape) and policy_shape != prior_shape:
        raise ValueError(
            f"AttractionKL: the prior's actions have shape {list(prior_shape)} but the policy's "
            f"{list(policy_shape)} (batch dims, then the action); the prior must act in the "
            f"policy's action space (it is read under prior_action_key={prior_action_key!r})."
        )


def _as_distribution(policy: D.Distribution | torch.Tensor) -> D.Distribution:
    """A deterministic action as ``N(action, I)`` (PyTorchRL's reading), a distribution as is."""
    if isinstance(policy, torch.Tensor):
        return D.Independent(D.Normal(policy, torch.ones_like(policy)), 1)
    return policy


def _mode(distribution: D.Distribution) -> torch.Tensor:
    """The deterministic action of a distribution: TorchRL's ``deterministic_sample`` (its mode
    or mean), else the mean."""
    if isinstance(distribution, CompositeDistribution):
        raise TypeError(
            "BehaviorCloning(mode='squared_error') needs one action tensor; the policy's "
            "distribution is composite (several heads): use mode='log_likelihood'."
        )
    sample = getattr(distribution, "deterministic_sample", None)
    return sample if sample is not None else distribution.mean


def check_policy_addons(owner: str, addons, deterministic: bool) -> list[PolicyLossAddon]:
    """The add-ons as a list (one add-on alone is accepted), each checked against the actor;
    a ``TypeError`` names what is not an add-on, a ``ValueError`` two add-ons writing the same
    entry."""
    if isinstance(addons, PolicyLossAddon):
        addons = [addons]
    if not isinstance(addons, (list, tuple)):
        raise TypeError(
            f"{owner}: policy_loss_addons must be a list of rlloss.PolicyLossAddon modules "
            f"(BehaviorCloning, AttractionKL, or your own subclass), got {type(addons).__name__}."
        )
    for index, addon in enumerate(addons):
        if not isinstance(addon, PolicyLossAddon):
            raise TypeError(
                f"{owner}: policy_loss_addons[{index}] is a {type(addon).__name__}, not an "
                "rlloss.PolicyLossAddon; subclass PolicyLossAddon and implement term(batch, "
                "actor) returning a [*B] tensor."
            )
        addon.check_actor(owner, deterministic)
    keys = [addon.out_key for addon in addons]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(
            f"{owner}: several policy_loss_addons write {repeated}; give each a distinct name "
            "(e.g. BehaviorCloning(name='bc_expert'))."
        )
    return list(addons)
