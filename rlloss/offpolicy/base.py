"""``TDTargetLoss``: the base of the off-policy losses (DQN, DDPG, TD3, SAC, MPO).

Each of them regresses a critic onto one-step targets ``y = r + gamma^n (1 - terminated)
V(s')`` built from replayed transitions. What they share lives here, once:

- the discount ``gamma`` (one default, TorchRL's 0.99) and ``make_value_estimator``, which sets
  it (these losses build their targets themselves; n-step through ``steps_to_next_obs``);
- the replay keys (``reward``, ``done``, ``terminated`` under ``"next"``, ``priority_weight``,
  ``steps_to_next_obs``, the written ``priority``), which each loss's ``_AcceptedKeys`` extends;
- the argument checks of ``loss_function``, ``reduction`` and the prioritized-replay options;
- the prioritized-replay weighting of per-sample losses and the ``td_error`` write-back;
- the critic regression, for one critic or an ensemble;
- target networks (``target_<name>_params``, found and updated by TorchRL's ``SoftUpdate`` and
  ``HardUpdate``), detached views of online networks and ensembles of Q networks.
"""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.utils import NestedKey
from torchrl.objectives.utils import ValueEstimators

from rlloss import _compat
from rlloss import functional as rlf
from rlloss._agent_dims import broadcast_to_agents
from rlloss._checks import (
    Coefficient,
    check_choice,
    check_entry_shape,
    check_in_range,
    next_key,
    warn_terminated_from_done,
)
from rlloss._ensembles import (
    Ensemble,
    FrozenCopy,
    ensemble_members,
    parameter_path,
    redraw_members,
    shared_parameters,
    stacked_members,
    tie_members,
    untie_members,
)
from rlloss._keywords import torchrl_keywords
from rlloss.common import LossModule, fill_padding
from rlloss.estimators.base import DEFAULT_GAMMA
from rlloss.estimators.registry import build_target_estimator
from rlloss.functional.critic import DISTANCES

PRIORITY_WEIGHTINGS = ("mean", "normalized")
# The default of a padding mask argument: not read yet, so read from the batch (None, the
# other possible value, means "read: nothing is padded").
READ_FROM_BATCH = object()


class TDTargetLoss(LossModule):
    """Base of the losses that regress a critic onto one-step TD targets of replayed
    transitions (see the module docstring).

    Args:
        loss_function: the critic's distance, ``"l2"``, ``"l1"`` or ``"smooth_l1"``.
        gamma: the discount (default 0.99; ``make_value_estimator(ValueEstimators.TD0,
            gamma=...)`` sets it too, as in TorchRL).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        use_prioritized_weights: ``"auto"`` (use ``priority_weight`` when present), ``True`` or
            ``False``.
        priority_weighting: ``"mean"``, the mean of ``w l`` (Schaul et al., arXiv:1511.05952), or
            ``"normalized"``, ``sum(w l) / sum(w)`` (TorchRL's).
        policy_loss_addons: extra terms on ``loss_actor`` for the losses with an actor
            (:mod:`rlloss.addons`), reduced as ``loss_actor`` (padding masks, replay weights)
            and reported as ``addon_<name>``.
        separate_losses: TorchRL's flag: the critic loss sends no gradient into weights it shares
            with the actor (rlloss's critics share none, see :class:`rlloss.SACLoss`).
        priority_key: TorchRL's removed keyword: a ``RuntimeError`` when given (set the key with
            ``set_keys(priority=...)``).
        deactivate_vmap: TorchRL's flag, kept as an attribute; no effect (rlloss's ensembles
            give the same numbers either way).
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """The replay keys of every off-policy loss."""

        priority: NestedKey = "td_error"  # written: the per-sample TD error, for PER, [*B]
        reward: NestedKey = "reward"  # read under "next", [*B, 1]
        done: NestedKey = "done"  # read under "next" (not by one-step targets), [*B, 1]
        terminated: NestedKey = "terminated"  # read under "next": stops bootstrapping, [*B, 1]
        priority_weight: NestedKey = "priority_weight"  # optional importance weights, [*B]
        steps_to_next_obs: NestedKey = "steps_to_next_obs"  # optional: n of n-step returns, [*B, 1]

    default_value_estimator = ValueEstimators.TD0
    _one_step_targets_only = False  # True: TD(1) / TD(lambda) estimators are refused
    gamma = Coefficient(low=0.0, high=1.0)
    _choices = {
        **LossModule._choices,
        "loss_function": DISTANCES,
        "use_prioritized_weights": (True, False, "auto"),
        "priority_weighting": PRIORITY_WEIGHTINGS,
    }

    def __init__(
        self,
        *,
        loss_function: str,
        gamma: float | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        separate_losses: bool = False,
        policy_loss_addons: list | None = None,
        priority_key: NestedKey | None = None,
        deactivate_vmap: bool = False,
    ) -> None:
        super().__init__()
        # TorchRL's keywords: priority_key refused (set_keys), deactivate_vmap kept, no effect
        torchrl = {"priority_key": priority_key, "deactivate_vmap": deactivate_vmap}
        torchrl_keywords(self, torchrl, accepted=(), translated=tuple(torchrl))
        self._register_policy_addons(policy_loss_addons)
        # TorchRL's flag: keep the critic loss's gradient off weights shared with the actor
        # (rlloss's critics never share the actor's weights: see the README's differences)
        self.separate_losses = separate_losses
        check_choice("loss_function", loss_function, DISTANCES)
        check_choice("use_prioritized_weights", use_prioritized_weights, (True, False, "auto"))
        check_choice("priority_weighting", priority_weighting, PRIORITY_WEIGHTINGS)
        self.gamma = DEFAULT_GAMMA if gamma is None else gamma  # checked on assignment
        self._lmbda: float | None = None  # TD(lambda) targets when set (make_value_estimator)
        self.reduction = self._check_reduction(reduction)
        self.loss_function = loss_function
        self.use_prioritized_weights = use_prioritized_weights
        self.priority_weighting = priority_weighting
        self._exposed: list[str] = []  # online networks whose ``<name>_params`` are exposed
        self._targets: list[tuple[str, FrozenCopy]] = []
        self._detached_views: list[tuple[str, FrozenCopy]] = []
        self._ensembles: list[tuple[str, Ensemble]] = []
        # ensemble name -> (owner submodule, {stacked key: owner's parameter name}): entries
        # that are views of another network's parameters (see _register_ensemble's tied_to)
        self._ties: dict[str, tuple[str, dict[str, str]]] = {}

    def make_value_estimator(self, value_type=None, **hyperparams):
        """Choose how targets are built, as TorchRL's off-policy losses do.

        ``ValueEstimators.TD0`` (the default): one-step targets, n-step through
        ``steps_to_next_obs``. ``TD1`` / ``TDLambda`` (``lmbda``): the batch's last dimension is
        read as time and the targets are TD(1) / TD(lambda) returns over it (``done`` cuts the
        traces, ``terminated`` stops bootstrapping). ``gamma`` defaults to the loss's.
        ``GAE``, ``VTrace`` and ``MAGAE`` need a state-value baseline and on-policy data:
        ``NotImplementedError``, as in TorchRL.
        """
        estimator, value_type = build_target_estimator(
            self, value_type, {"gamma": self.gamma, **hyperparams}, self._one_step_targets_only
        )
        _compat.store_value_estimator(self, estimator)
        self.value_type = value_type
        self.gamma = estimator.gamma
        self._lmbda = getattr(estimator, "lmbda", None)
        self._forward_value_estimator_keys()
        return self

    # ----------------------------------------------------------------------------- targets
    def _td_target(self, tensordict: TensorDictBase, next_value: torch.Tensor) -> torch.Tensor:
        """``r + gamma^n (1 - terminated) V(s')``, ``[*B, 1]`` (``[*B, K]`` for the ``K`` atoms of a
        distributional critic, ``[*B, n_agents, 1]`` for per-agent values, whose reward and flags
        may be the team's: see :meth:`_per_agent`; ``n``: ``steps_to_next_obs`` when the batch has
        it, else 1); with a TD(1) / TD(lambda) estimator, the lambda-return over the batch's last
        dimension (see :meth:`make_value_estimator`)."""
        reward, terminated, discount = self._bootstrap_terms(tensordict, next_value)
        if self._lmbda is None:
            if (
                next_value.shape[-1] != 1
                and next_value.shape[:-1] == reward.shape[:-1]
                and reward.shape[-1:] == (1,)
            ):
                # ``[*B, K]`` atoms of a distributional critic share the reward and the flags
                reward, terminated = reward.expand_as(next_value), terminated.expand_as(next_value)
            return rlf.td0_return(reward, next_value, terminated, discount)
        done = self._per_agent(tensordict, "done", next_value)
        next_value = next_value.view_as(reward)
        time_dim = tensordict.batch_dims - 1 - reward.ndim  # the batch's last dim
        return rlf.td_lambda_return(
            reward, next_value, done, terminated, discount, self._lmbda, time_dim
        )

    def _bootstrap_terms(self, tensordict: TensorDictBase, next_value: torch.Tensor) -> tuple:
        """The reward ``[*B, 1]``, the termination flag ``[*B, 1]`` (``done`` in its place when
        the batch has none, as TorchRL, with a warning), both one per agent for per-agent values
        (:meth:`_per_agent`), and the discount ``gamma^n`` (a scalar, or ``[*B, 1]`` with
        ``steps_to_next_obs``) of the batch's transitions."""
        reward = self._get(tensordict, "reward", nested=True)
        flag, terminated = "terminated", self._read(tensordict, "terminated", nested=True)
        if terminated is None:  # TorchRL's fallback
            terminated = self._read(tensordict, "done", nested=True)
            if terminated is None:  # the error names this one
                self._get(tensordict, "terminated", nested=True)
            warn_terminated_from_done(
                type(self).__name__, self.tensor_keys.terminated, self.tensor_keys.done
            )
            flag = "done"
        # Per-agent values only (one dim more than [*B, 1]) take the agents' copies (the test
        # made once here, not in _per_agent for each entry).
        if next_value.ndim == tensordict.batch_dims + 2:
            reward = self._per_agent(tensordict, "reward", next_value, reward)
            terminated = self._per_agent(tensordict, flag, next_value, terminated)
        steps = self._read(tensordict, "steps_to_next_obs")
        if steps is not None:
            key = self.tensor_keys.steps_to_next_obs
            check_entry_shape(type(self).__name__, key, steps, tensordict.batch_size)
            steps = steps.reshape(
                tensordict.batch_size + (1,) * (reward.ndim - tensordict.batch_dims)
            )
        return reward, terminated, rlf.bootstrap_discount(self.gamma, steps, reward.dtype)

    def _per_agent(
        self,
        tensordict: TensorDictBase,
        name: str,
        next_value: torch.Tensor,
        tensor: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The entry ``("next", tensor_keys.<name>)`` (the reward, ``done`` or ``terminated``);
        for per-agent values ``[*B, n_agents, K]`` (one dim more than ``[*B, 1]``) one entry per
        agent, ``[*B, n_agents, 1]``: a team entry ``[*B, 1]`` is copied to the agents, a
        per-agent one kept, any other shape refused with the entry, its shape, the shapes it may
        have and the fix (:func:`rlloss._agent_dims.broadcast_to_agents`, MultiAgentGAE's rule).
        ``tensor``: the entry when already read.
        """
        tensor = self._get(tensordict, name, nested=True) if tensor is None else tensor
        if next_value.ndim != tensordict.batch_dims + 2:
            return tensor
        key = next_key(getattr(self.tensor_keys, name))
        owner = type(self).__name__
        values_shape = next_value.shape[:-1] + (1,)
        return broadcast_to_agents(tensor, values_shape, name=name, key=key, owner=owner)

    # ----------------------------------------------------------------------------- critic
    def _reduce_replayed(self, loss: torch.Tensor, tensordict: TensorDictBase) -> torch.Tensor:
        """Reduce a per-transition loss ``[*B, 1]``, weighted by ``priority_weight`` when the
        batch has it (``use_prioritized_weights``), as ``priority_weighting`` says; ``"none"``
        gives ``[*B]`` as TorchRL does."""
        loss = rlf.reduce(loss, self.reduction, **self._replay_weighting(tensordict))
        return loss.squeeze(-1) if self.reduction == "none" else loss

    def _replay_weighting(self, tensordict: TensorDictBase, mask=READ_FROM_BATCH) -> dict:
        """``rlf.reduce``'s keywords for the batch: its importance weights (``None`` without, or
        with ``use_prioritized_weights=False``), its valid transitions (``None``: all) and
        whether the weights are normalised. ``mask``: the valid transitions when the forward
        has read them already (:meth:`_valid_batch_and_mask`), else read from the batch."""
        weights = None
        if self.use_prioritized_weights is not False:
            weights = self._read(tensordict, "priority_weight")
            if weights is None and self.use_prioritized_weights is True:
                self._get(tensordict, "priority_weight")  # raises: weights asked for, none given
            if weights is not None:
                key = self.tensor_keys.priority_weight
                check_entry_shape(type(self).__name__, key, weights, tensordict.batch_size)
        return {
            "mask": self._loss_mask(tensordict) if mask is READ_FROM_BATCH else mask,
            "weights": weights,
            "normalize_weights": self.priority_weighting == "normalized",
        }

    def _reduce_policy_term(self, term: torch.Tensor, batch: TensorDictBase) -> torch.Tensor:
        """``term`` (``[*B]``) reduced as ``loss_actor``: replay weights, padding, reduction."""
        return self._reduce_replayed(term.unsqueeze(-1), batch)

    def _padding_mask(self, tensordict: TensorDictBase) -> torch.Tensor | None:
        mask = self._loss_mask(tensordict)
        return None if mask is None else mask.squeeze(-1)

    def _valid_batch(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``tensordict``, or, when it marks padded transitions (``loss_mask_key``), a copy whose
        padding holds a valid transition (:func:`rlloss.common.fill_padding`): padding then
        reaches no value and no gradient. The priority is still written into ``tensordict``."""
        mask = self._padding_mask(tensordict)
        if mask is None:
            return tensordict
        return fill_padding(tensordict, mask, self._mask_paths())

    def _valid_batch_and_mask(self, tensordict: TensorDictBase) -> tuple:
        """:meth:`_valid_batch` and the padding mask it read (``[*B, 1]``; ``None``: nothing
        padded), for a forward that passes the mask on to :meth:`_critic_loss`: the batch's mask
        entries are then looked up once a forward instead of twice."""
        mask = self._loss_mask(tensordict)
        if mask is None:
            return tensordict, None
        return fill_padding(tensordict, mask.squeeze(-1), self._mask_paths()), mask

    def _critic_loss(
        self,
        value: torch.Tensor,
        target: torch.Tensor,
        tensordict: TensorDictBase,
        mask=READ_FROM_BATCH,
    ) -> torch.Tensor:
        """``L(Q(s, a), y)`` of one critic (``[*B, 1]``), reduced with the replay weights; without
        weights or padding, reduced inside the distance (one autograd node, the same value).
        ``mask``: the padding mask as :meth:`_valid_batch_and_mask` read it, if it did."""
        weighting = self._replay_weighting(tensordict, mask)
        loss = rlf.reduced_distance(value, target, self.loss_function, self.reduction, **weighting)
        return loss.squeeze(-1) if self.reduction == "none" else loss

    def _ensemble_critic_loss(
        self, values: torch.Tensor, target: torch.Tensor, tensordict: TensorDictBase
    ) -> torch.Tensor:
        """``sum_i L(Q_i(s, a), y)`` of an ensemble (``[E, *B, 1]``), reduced with the replay
        weights."""
        loss = rlf.distance(values, target.expand_as(values), self.loss_function).sum(0)
        return self._reduce_replayed(loss, tensordict)

    def _valid_mean(
        self, value: torch.Tensor, tensordict: TensorDictBase, dim: int | None = None
    ) -> torch.Tensor:
        """A diagnostic ``[*B, ...]`` averaged over the batch's valid transitions (every one
        without padding), over all dims, or over ``dim`` only (as ``value.mean(dim)``)."""
        mask = self._padding_mask(tensordict)
        if mask is None:
            return value.mean() if dim is None else value.mean(dim)
        mask = mask.reshape(*mask.shape, *(1,) * (value.ndim - mask.ndim)).expand_as(value)
        total = torch.where(mask, value, 0.0)
        if dim is None:
            return total.sum() / mask.sum().clamp_min(1)
        return total.sum(dim) / mask.sum(dim).clamp_min(1)

    def _write_priority(self, tensordict: TensorDictBase, td_error: torch.Tensor) -> None:
        """Write the per-sample TD error into the caller's batch, for
        ``replay_buffer.update_tensordict_priority(batch)``."""
        self._write(tensordict, "priority", td_error)

    def _actor_then_ensemble_losses(self, tensordict: TensorDictBase) -> tuple:
        """``(batch, (loss_actor, info), (loss_qvalue, info))``: :meth:`_valid_batch`, then a loss's
        ``loss_actor`` and ``loss_qvalue`` on it, in that order (that of their random draws); the
        critic ensemble's ``td_error`` (its largest over the members) is written as the priority."""
        batch = self._valid_batch(tensordict)
        actor, critic = self.loss_actor(batch), self.loss_qvalue(batch)
        self._write_priority(tensordict, critic[1]["td_error"].amax(0))
        return batch, actor, critic

    # ----------------------------------------------------------------------------- networks
    def _expose_parameters(self, *names: str) -> None:
        """Expose the parameters of the submodules ``names`` as ``<name>_params`` (a TensorDict
        of views, refreshed when the loss moves), as TorchRL's losses do: its updaters and
        training scripts read them (``Adam(loss.actor_network_params.values(True, True))``)."""
        self._exposed += [name for name in names if name not in self._exposed]
        self._refresh_views()

    def _register_target_network(self, name: str, until: NestedKey | None = None) -> FrozenCopy:
        """A target copy of the submodule ``name``, whose tensors are ``target_<name>_params``.

        ``<name>_params`` exposes the online parameters to TorchRL's ``SoftUpdate`` and
        ``HardUpdate``, which update the target tensors in place. ``until``: the output key the
        loss needs (see :class:`rlloss._networks.NetworkCall`). Returns the copy, to be held in
        a named attribute and called (under ``torch.no_grad()``) to build targets.
        """
        _compat.expect_updater(self, name)
        target = FrozenCopy(getattr(self, name), until)
        self._exposed += [name] if name not in self._exposed else []
        setattr(
            self,
            f"target_{name}_params",
            TensorDictParams(TensorDict.from_module(target.module), no_convert=True),
        )
        self._targets.append((name, target))
        self._refresh_views()
        self._warn_until_every_target_has_an_updater()
        return target

    def _register_detached_view(self, name: str, until: NestedKey | None = None) -> FrozenCopy:
        """A copy of the submodule ``name`` whose tensors are detached views of its parameters:
        always current, never trained, free to call (e.g. the critic inside an actor loss)."""
        view = FrozenCopy(getattr(self, name), until)
        self._detached_views.append((name, view))
        self._refresh_views()
        return view

    def _register_ensemble(
        self,
        name: str,
        networks,
        size: int,
        *,
        target: bool,
        until: NestedKey | None = None,
        tied_to: str | None = None,
    ) -> Ensemble:
        """``size`` copies of a network held as stacked tensors and evaluated in one batched
        call (:class:`rlloss._networks.Ensemble`).

        ``networks`` is one module (its copies are re-initialised with ``reset_parameters``, so
        they differ) or a list of ``size`` modules (their weights are kept). The stacked
        parameters, ``<name>_params`` (``[size, ...]``), are the loss's trainable parameters;
        with ``target``, ``target_<name>_params`` holds stacked target buffers for TorchRL's
        updaters. The given modules themselves are not trained: read the trained weights from
        the loss.

        ``tied_to``: the name of a submodule (e.g. ``"actor_network"``) whose parameters the
        members may hold themselves (layers shared with the actor): those entries of
        ``<name>_params`` are detached expansions of its parameters (TorchRL's
        ``compare_against``), so the members always use its current values and the ensemble's
        losses send them no gradient (``separate_losses=True``).
        """
        given = len(networks) if isinstance(networks, (list, tuple)) else 1
        # as TorchRL's: the members of a list are never compared with the other network
        tied = None if tied_to is None or given > 1 else getattr(self, tied_to)
        modules = ensemble_members(type(self).__name__, name, networks, size)
        stacked = stacked_members(modules)
        ensemble = Ensemble(modules[0], until)
        if tied is not None:
            self._ties[name] = (tied_to, shared_parameters(modules[0], tied))
            for key in self._ties[name][1]:  # buffers, replaced by the views in _refresh_views
                stacked.set(parameter_path(key), stacked.get(parameter_path(key)).data)
        setattr(self, f"{name}_params", TensorDictParams(stacked, no_convert=True))
        if target:
            _compat.expect_updater(self, name)
            setattr(
                self,
                f"target_{name}_params",
                TensorDictParams(stacked.detach().clone(), no_convert=True),
            )
            self._warn_until_every_target_has_an_updater()
        self._ensembles.append((name, ensemble))
        self._refresh_views()
        return ensemble

    def _register_qvalue_ensemble(self, networks, num_qvalue_nets: int, **options) -> Ensemble:
        """The ``num_qvalue_nets`` Q networks (an integer >= 1, kept as ``num_qvalue_nets``) as
        the ensemble ``qvalue_network`` (``options``: :meth:`_register_ensemble`'s keywords)."""
        check_in_range("num_qvalue_nets", num_qvalue_nets, 1, integer=True)
        self.num_qvalue_nets = int(num_qvalue_nets)
        return self._register_ensemble("qvalue_network", networks, self.num_qvalue_nets, **options)

    @torch.no_grad()
    def reset_parameters_recursive(self) -> None:
        """Re-initialise every network (see :meth:`rlloss.LossModule.reset_parameters_recursive`):
        each ensemble member gets a fresh draw of its architecture's initialisation, and every
        target network starts from the new online weights (TorchRL draws its targets
        independently; a target equal to its network is the usual start)."""
        super().reset_parameters_recursive()
        children = dict(self.named_children())
        for name, ensemble in self._ensembles:
            redraw_members(children[f"{name}_params"], ensemble.template)
        for name in [*(n for n, _ in self._targets), *(n for n, _ in self._ensembles)]:
            target = children.get(f"target_{name}_params")
            if target is not None:
                online = children.get(f"{name}_params")
                if online is None:  # a single network: its own parameters
                    online = TensorDict.from_module(getattr(self, name))
                target.update_(online.detach())

    def _refresh_views(self) -> None:
        """Point the target copies at ``target_<name>_params`` and ``<name>_params`` at the
        online tensors, the detached views at the online parameters and the ensembles at their
        stacked tensors (after construction, ``.to()``, ``.double()`` or a deep copy)."""
        # the target tensors are read from the module tree: ``getattr`` would go through
        # TorchRL's ``__getattr__``, which warns while no updater is associated
        children = dict(self.named_children())
        for name in self._exposed:
            setattr(self, f"{name}_params", TensorDict.from_module(getattr(self, name)))
        for name, target in self._targets:
            target.use(children[f"target_{name}_params"].flatten_keys("."))
        for name, view in self._detached_views:
            view.use({k: p.detach() for k, p in getattr(self, name).named_parameters()})
        for name, (owner, shared) in self._ties.items():
            parameters = dict(children[owner].named_parameters())
            tie_members(children[f"{name}_params"], parameters, shared)
        for name, ensemble in self._ensembles:
            ensemble.use(children[f"{name}_params"], children.get(f"target_{name}_params"))

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """:meth:`rlloss.LossModule.load_state_dict`; the ensemble entries tied to another
        network's parameters (``separate_losses``) are read back from that network's entries."""
        if not self._ties:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        children = dict(self.named_children())
        for name, (_, shared) in self._ties.items():  # writable copies while loading
            untie_members(children[f"{name}_params"], shared)
        try:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        finally:
            self._refresh_views()
