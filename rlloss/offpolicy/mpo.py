"""MPO for Gaussian policies: ``MPOLoss`` (decoupled mean and covariance constraints,
per-dimension multipliers, optional action penalisation), on the MPO base
:class:`rlloss.offpolicy.mpo_base.MaximumAPosteriori` (online and target actor and critic, the
softplus-parameterised dual variables and their floor, ``forward``) that it shares with
:class:`rlloss.DiscreteMPOLoss` (``offpolicy/discrete_mpo.py``, categorical policies).

Abdolmaleki et al., "Maximum a Posteriori Policy Optimisation", arXiv:1806.06920; "Relative
Entropy Regularized Policy Iteration", arXiv:1812.02256. DeepMind Acme is the reference
implementation; the defaults are Acme's.

The Lagrange multipliers (``temperature``, ``alpha``...) are parameters of the loss, softplus
parameterised as in Acme and projected onto Acme's floor outside the graph: the ``Duals``
paragraph of :class:`MPOLoss` says how, and how to optimise them.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import Bounded, Composite, TensorSpec
from torchrl.modules import IndependentNormal, TanhNormal

from rlloss import functional as rlf
from rlloss._checks import Coefficient, check_in_range
from rlloss.addons import ActorOutput
from rlloss.offpolicy.base import TDTargetLoss
from rlloss.offpolicy.mpo_base import MaximumAPosteriori


class MPOLoss(MaximumAPosteriori):
    r"""MPO with decoupled KL constraints for a Gaussian or tanh-Gaussian policy.

    E-step (arXiv:1806.06920, sec. 4): at each state ``s_i`` draw ``N = num_samples`` actions
    ``a_ij`` from the target policy, score them with the target critic, and weight them (no
    gradient); the temperature $\eta$ has its dual loss:

    $$
    w_{ij} = \frac{\exp(Q_{ij} / \eta)}{\sum_{j'} \exp(Q_{ij'} / \eta)}, \qquad
    \mathcal{L}_{\eta} = \eta \Big(\epsilon + \frac{1}{B} \sum_i
    \log \sum_j \exp(Q_{ij} / \eta) - \log N\Big)
    $$

    M-step, decoupled (arXiv:1812.02256, sec. 4.2): with the online ``N(mu, sigma)`` and the
    target ``N(mu_t, sigma_t)``, ``pi_mean = N(mu, sigma_t)`` and ``pi_stddev = N(mu_t, sigma)``;
    ``loss_actor = -mean_i sum_j w_ij (log pi_mean(a_ij) + log pi_stddev(a_ij)) + sum_d
    sg(alpha_mean_d) KL_mean_d + sum_d sg(alpha_stddev_d) KL_stddev_d`` with ``KL_mean =
    KL(pi_target || pi_mean)`` and ``KL_stddev = KL(pi_target || pi_stddev)`` per action
    dimension (one multiplier per dimension; summed over dimensions and one multiplier with
    ``per_dim_constraining=False``); ``loss_alpha = sum_d alpha_d (epsilon_d - sg(KL_d))`` for
    both. Batch means are taken over states ``i``.

    Critic (expected SARSA): ``L(Q(s, a), y)``, ``y = r + gamma^n (1 - terminated) mean_j
    Q_target(s', a'_j)`` with ``a'_j`` drawn from the target policy at ``s'``. With an
    IndependentNormal actor the critic sees every action clipped to the bounds, the batch's
    too (the buffer may store the unclipped sample, as Acme does).

    Actors: a TorchRL ``ProbabilisticActor`` writing ``loc`` and ``scale``, over
    ``IndependentNormal`` (Acme's setting: samples are clipped to the action bounds before the
    critic, the log-likelihoods and the action penalty use the unclipped samples) or
    ``TanhNormal`` (the samples are squashed; since KL is invariant under the tanh bijection, the
    KLs are those of the base Gaussians, and the log-likelihoods are the tanh-Normal's,
    computed from the pre-tanh draw).

    Action penalisation (MO-MPO, arXiv:2005.07513): a second E-step on the cost ``-||a -
    clip(a, low, high)||_2`` with its own temperature (bound ``epsilon_penalty``); its weights
    are added to ``w`` and its temperature loss to ``loss_temperature``.

    Duals: ``temperature = softplus(log_temperature) + 1e-8``, likewise ``alpha_mean``,
    ``alpha_stddev`` (``[D]``, or ``[1]`` without ``per_dim_constraining``) and
    ``penalty_temperature``: parameters of the loss, listed by :meth:`dual_parameters`
    for their own optimizer or parameter group (Acme: Adam, lr 1e-2 for the duals and 1e-4 for
    the networks, gradient norms clipped at 40). Each is projected in place onto ``[-18, inf)``
    before use (and by :meth:`clamp_duals`), outside the graph, so a dual at the floor still gets
    its gradient and can grow again.

    Args:
        actor_network: a ``ProbabilisticActor`` over ``IndependentNormal`` or ``TanhNormal``.
        qvalue_network: a module reading the observation and ``action`` and writing
            ``state_action_value``.
        num_samples: ``N``, actions drawn per state (for the E-step and for the critic target).
        epsilon: the E-step KL bound. epsilon_mean, epsilon_stddev: the M-step bounds on
            ``KL_mean`` and ``KL_stddev``, per action dimension when ``per_dim_constraining``
            (Acme's values are per dimension), else on their sum over dimensions.
        init_log_temperature: initial dual
            parameters (softplus space, Acme's defaults).
        init_log_alpha_mean: as ``init_log_temperature``.
        init_log_alpha_stddev: as ``init_log_temperature``.
        alpha_mean_max: caps on the mean and scale multipliers
            (pytorchrl's ``alpha_mean_max`` / ``alpha_var_max``; ``None``: uncapped), enforced
            by :meth:`clamp_duals` at every ``loss_actor`` call.
        alpha_stddev_max: as ``alpha_mean_max``.
        alpha_mean_scale: factors on those multipliers' dual losses, i.e.
            on their step sizes (pytorchrl's ``alpha_mean_scale`` / ``alpha_var_scale``;
            default 1).
        alpha_stddev_scale: as ``alpha_mean_scale``.
        action_penalization: MO-MPO's action penalty (needs action bounds).
        epsilon_penalty: MO-MPO's action penalty (needs action bounds).
        delay_actor: keep target copies (update them with ``SoftUpdate`` or
            ``HardUpdate``); without, the online network's outputs are used without gradient.
        delay_qvalue: as ``delay_actor``.
        loss_function: see
            :class:`rlloss.offpolicy.TDTargetLoss` (``loss_function`` defaults to ``"l2"``); the
            importance weights weight the per-state actor and dual losses too.
        gamma: as ``loss_function``.
        reduction: as ``loss_function``.
        use_prioritized_weights: as ``loss_function``.
        priority_weighting: as ``loss_function``.
        policy_loss_addons: as ``loss_function``.
        action_spec: the action spec (a ``Bounded`` or a ``Composite`` holding one) giving the
            bounds and the action dimension; default: the actor's ``spec``.

    Outputs: ``loss_actor``, ``loss_qvalue``, ``loss_temperature``, ``loss_alpha`` (mean and
    stddev duals); diagnostics ``temperature``, ``alpha_mean``, ``alpha_stddev`` (means over
    dimensions), ``kl_mean``, ``kl_stddev`` (summed over dimensions, batch means), ``kl_q``
    (``sum_j w_ij log(N w_ij)``, the E-step policy's KL from the target policy), ``q_mean``
    (of the E-step's sampled actions), and ``penalty_temperature`` with action penalisation.
    ``forward`` writes ``td_error`` (``|Q(s, a) - y|``, ``[*B]``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import NormalParamExtractor, TensorDictModule
        >>> from torchrl.data import Bounded
        >>> from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
        >>> from rlloss import MPOLoss, SoftUpdate
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
        >>> loss = MPOLoss(actor, qvalue, action_spec=Bounded(-1, 1, (1,)), num_samples=4)
        >>> updater = SoftUpdate(loss, tau=0.005)
        >>> optimizer = torch.optim.Adam(
        ...     [
        ...         {"params": [*actor.parameters(), *qvalue.parameters()], "lr": 1e-4},
        ...         {"params": list(loss.dual_parameters()), "lr": 1e-2},
        ...     ]
        ... )  # the Lagrange multipliers
        >>> out = loss(batch)
        >>> sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        >>> optimizer.step()
        >>> updater.step()
    """

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        """Keys read by MPOLoss (``priority``: ``|TD error|``, ``[*B]``)."""

        action: NestedKey = "action"  # the action taken (and the Q network's action input), [*B, A]
        state_action_value: NestedKey = "state_action_value"  # written by the Q network, [*B, 1]

    # the M-step's KL bounds (mean, stddev) and the action penalty's
    epsilon_mean = Coefficient(low=0.0, low_open=True)
    epsilon_stddev = Coefficient(low=0.0, low_open=True)
    epsilon_penalty = Coefficient(low=0.0, low_open=True)
    num_samples = Coefficient(low=1, integer=True)

    def __init__(
        self,
        actor_network: nn.Module,
        qvalue_network: nn.Module,
        *,
        num_samples: int = 20,
        epsilon: float = 0.1,
        epsilon_mean: float = 2.5e-3,
        epsilon_stddev: float = 1e-6,
        per_dim_constraining: bool = True,
        init_log_temperature: float = 10.0,
        init_log_alpha_mean: float = 10.0,
        init_log_alpha_stddev: float = 1000.0,
        alpha_mean_max: float | None = None,
        alpha_stddev_max: float | None = None,
        alpha_mean_scale: float = 1.0,
        alpha_stddev_scale: float = 1.0,
        action_penalization: bool = False,
        epsilon_penalty: float = 1e-3,
        action_spec: TensorSpec | None = None,
        loss_function: str = "l2",
        delay_actor: bool = True,
        delay_qvalue: bool = True,
        gamma: float | None = None,
        reduction: str | None = None,
        use_prioritized_weights: bool | str = "auto",
        priority_weighting: str = "mean",
        separate_losses: bool = False,
        policy_loss_addons: list | None = None,
    ) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int):
            raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}.")
        MPOLoss.num_samples.check(num_samples)
        super().__init__(
            actor_network,
            qvalue_network,
            value="state_action_value",
            loss_function=loss_function,
            delay_actor=delay_actor,
            delay_qvalue=delay_qvalue,
            gamma=gamma,
            reduction=reduction,
            use_prioritized_weights=use_prioritized_weights,
            priority_weighting=priority_weighting,
            separate_losses=separate_losses,
            policy_loss_addons=policy_loss_addons,
        )
        self._register_coefficients(
            epsilon=epsilon,
            epsilon_mean=epsilon_mean,
            epsilon_stddev=epsilon_stddev,
            epsilon_penalty=epsilon_penalty,
            num_samples=num_samples,
        )
        self.per_dim_constraining = per_dim_constraining
        self.action_penalization = action_penalization
        self._check_qvalue_reads_action()
        self._tanh_normal = self._check_actor(actor_network)
        spec = action_spec if action_spec is not None else getattr(actor_network, "spec", None)
        if isinstance(spec, Composite):
            spec = spec.get(self.tensor_keys.action, None)
        device = next(actor_network.parameters()).device
        self._register_bounds(spec, device)
        if action_penalization and not self._bounded:
            raise ValueError(
                "MPOLoss: action_penalization needs the action bounds: pass action_spec=<a "
                "Bounded spec> or build the actor with spec=..."
            )
        self._register_dual("log_temperature", init_log_temperature, (), device)
        self._register_constraint_duals(
            (self._action_dim(spec),) if per_dim_constraining else (1,),
            device,
            mean=(init_log_alpha_mean, alpha_mean_max, alpha_mean_scale),
            stddev=(init_log_alpha_stddev, alpha_stddev_max, alpha_stddev_scale),
        )
        if action_penalization:
            self._register_dual("log_penalty_temperature", init_log_temperature, (), device)

    def _check_qvalue_reads_action(self) -> None:
        self._qvalue_action_key = self.tensor_keys.action
        if self._qvalue_action_key not in self._qvalue_in_keys:
            raise ValueError(
                f"MPOLoss: qvalue_network must read the action under {self._qvalue_action_key!r};"
                f" its in_keys are {self._qvalue_in_keys}."
            )

    def _register_constraint_duals(self, shape: tuple[int, ...], device, **duals) -> None:
        """The M-step multipliers ``log_alpha_<name>``, one per ``name=(init, maximum, scale)``
        (``maximum``: ``None`` or > 0; ``scale`` > 0), of shape ``shape``."""
        for name, (_, maximum, _) in duals.items():
            if maximum is not None:
                check_in_range(f"alpha_{name}_max", maximum, 0.0, low_open=True)
        for name, (_, _, scale) in duals.items():
            check_in_range(f"alpha_{name}_scale", scale, 0.0, low_open=True)
        for name, (init, maximum, scale) in duals.items():
            self._register_dual(f"log_alpha_{name}", init, shape, device, maximum, scale)

    @property
    def out_keys(self) -> list[str]:
        keys = ["loss_actor", "loss_qvalue", "loss_temperature", "loss_alpha", "temperature"]
        keys += ["alpha_mean", "alpha_stddev", "kl_mean", "kl_stddev", "kl_q", "q_mean"]
        return keys + (["penalty_temperature"] if self.action_penalization else [])

    def _check_actor(self, actor_network) -> bool:
        """``True`` for a TanhNormal actor, ``False`` for an IndependentNormal one; else raise."""
        head = self._actor_call.head
        family = None if head is None else head.distribution_class
        kwargs = {} if head is None else dict(head.distribution_kwargs)
        supported = (
            self._actor_call.direct
            and family in (IndependentNormal, TanhNormal)
            and set(self._actor_call.parameter_keys) == {"loc", "scale"}
            and not kwargs.get("tanh_loc", False)
            and kwargs.get("event_dims", 1) == 1
            and kwargs.get("event_dim", 1) == 1
        )
        if not supported:
            raise ValueError(
                "MPOLoss: actor_network must be a TorchRL ProbabilisticActor over "
                "IndependentNormal or TanhNormal (tanh_loc=False) whose module writes 'loc' and "
                "'scale'; got "
                f"{type(actor_network).__name__} over {getattr(family, '__name__', family)}."
            )
        return family is TanhNormal

    def _register_bounds(self, spec, device) -> None:
        """``action_low``/``action_high`` buffers: the TanhNormal's bounds, else the spec's."""
        dtype = torch.get_default_dtype()
        if self._tanh_normal:
            low, high = self._actor_call.bounds
        elif isinstance(spec, Bounded):
            low, high = spec.space.low, spec.space.high
        else:
            low, high = -math.inf, math.inf
        self._bounded = self._tanh_normal or isinstance(spec, Bounded)
        for name, bound in (("low", low), ("high", high)):
            value = torch.as_tensor(bound, dtype=dtype).to(device)
            self.register_buffer(f"action_{name}", value.clone())

    def _action_dim(self, spec) -> int:
        """``D`` for per-dimension multipliers: from the spec, else from tensor bounds."""
        if spec is not None and len(spec.shape):
            return int(spec.shape[-1])
        if self.action_low.numel() > 1:
            return self.action_low.numel()
        raise ValueError(
            "MPOLoss: per_dim_constraining=True needs the action dimension for its per-dimension "
            "multipliers: pass action_spec=<the action spec> or build the actor with spec=..."
        )

    # ----------------------------------------------------------------------------- policy
    def _target_policy_samples(self, batch: TensorDictBase) -> dict[str, torch.Tensor]:
        """Under ``no_grad``: the target policy's ``loc``/``scale`` ``[*B, D]``, ``N`` draws of
        its pre-tanh value ``u`` and action ``a`` ``[N, *B, D]`` and their target values
        ``Q_target(s, a)`` ``[N, *B]`` (IndependentNormal actions clipped to the bounds first)."""
        with torch.no_grad():
            params = self._target_actor_call.distribution_parameters(batch)
            keys = self._actor_call.parameter_keys
            loc, scale = params[keys["loc"]], params[keys["scale"]]
            preimage = rlf.gaussian_samples(loc, scale, self.num_samples)
            if self._tanh_normal:
                action = rlf.squash(preimage, self.action_low, self.action_high)
                critic_action = action
            else:
                action = preimage
                critic_action = torch.clamp(preimage, self.action_low, self.action_high)
            outputs = self._target_qvalue_call.at_action(
                batch, self._qvalue_action_key, critic_action, samples_dim=0
            )
            value = outputs[self.tensor_keys.state_action_value].squeeze(-1)
        return {"loc": loc, "scale": scale, "preimage": preimage, "action": action, "q": value}

    def _log_prob(self, preimage, loc, scale) -> torch.Tensor:
        """``log pi(a)`` ``[N, *B]`` of the draws under ``N(loc, scale)`` (tanh-squashed for a
        TanhNormal actor, from the pre-tanh value)."""
        if self._tanh_normal:
            return rlf.tanh_normal_log_prob(preimage, loc, scale, self.action_low, self.action_high)
        return rlf.gaussian_log_prob(preimage, loc, scale)

    def _constrained(self, kl: torch.Tensor) -> torch.Tensor:
        """Per-dimension KLs ``[*B, D]``, or their sum ``[*B, 1]`` for a single multiplier."""
        return kl if self.per_dim_constraining else kl.sum(-1, keepdim=True)

    def loss_actor(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The decoupled M-step loss reduced, and in the metadata the dual losses
        ``loss_temperature`` and ``loss_alpha`` and the detached diagnostics (see the class
        docstring). Projects the dual parameters onto their floor first."""
        self.clamp_duals()
        temperature = self._dual("log_temperature")
        alpha_mean, alpha_stddev = self._dual("log_alpha_mean"), self._dual("log_alpha_stddev")
        target = self._target_policy_samples(tensordict)
        params = self._actor_call.distribution_parameters(tensordict)
        keys = self._actor_call.parameter_keys
        loc, scale = params[keys["loc"]], params[keys["scale"]]

        # E-step: weights over the samples and the temperature dual.
        weights = rlf.mpo_weights(target["q"], temperature)
        loss_temperature = rlf.mpo_temperature_loss(target["q"], temperature, self.epsilon)
        kl_q = rlf.mpo_sample_kl(weights)
        if self.action_penalization:
            penalty_temperature = self._dual("log_penalty_temperature")
            cost = rlf.action_penalty_cost(target["action"], self.action_low, self.action_high)
            weights = weights + rlf.mpo_weights(cost, penalty_temperature)
            loss_temperature = loss_temperature + rlf.mpo_temperature_loss(
                cost, penalty_temperature, self.epsilon_penalty
            )

        # M-step: weighted likelihood of the decoupled policies, KL penalties and their duals.
        preimage = target["preimage"]
        log_prob_mean = self._log_prob(preimage, loc, target["scale"])
        log_prob_stddev = self._log_prob(preimage, target["loc"], scale)
        kl_mean, kl_stddev = rlf.decoupled_gaussian_kl(target["loc"], target["scale"], loc, scale)
        kl_mean, kl_stddev = self._constrained(kl_mean), self._constrained(kl_stddev)
        loss = (
            rlf.weighted_log_likelihood_loss(log_prob_mean, weights)
            + rlf.weighted_log_likelihood_loss(log_prob_stddev, weights)
            + rlf.kl_penalty(kl_mean, alpha_mean)
            + rlf.kl_penalty(kl_stddev, alpha_stddev)
        )
        loss_alpha = self._dual_loss("log_alpha_mean", alpha_mean, kl_mean, self.epsilon_mean)
        loss_alpha = loss_alpha + self._dual_loss(
            "log_alpha_stddev", alpha_stddev, kl_stddev, self.epsilon_stddev
        )

        info = {
            "loss_temperature": self._reduce_replayed(loss_temperature.unsqueeze(-1), tensordict),
            "loss_alpha": self._reduce_replayed(loss_alpha.unsqueeze(-1), tensordict),
            "temperature": temperature.detach(),
            "alpha_mean": alpha_mean.detach().mean(),
            "alpha_stddev": alpha_stddev.detach().mean(),
            "kl_mean": kl_mean.detach().sum(-1).mean(),
            "kl_stddev": kl_stddev.detach().sum(-1).mean(),
            "kl_q": kl_q.mean(),
            "q_mean": target["q"].mean(),
        }
        if self.action_penalization:
            info["penalty_temperature"] = penalty_temperature.detach()
        loss = self._reduce_replayed(loss.unsqueeze(-1), tensordict)
        actor = ActorOutput(distribution=lambda: self._actor_call.from_parameters(params))
        return self._with_policy_addons(loss, tensordict, actor, info)

    # ----------------------------------------------------------------------------- critic
    def loss_qvalue(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """``L(Q(s, a), y)`` reduced with the expected-SARSA target ``y = r + gamma^n (1 -
        terminated) mean_j Q_target(s', a'_j)``, ``a'_j`` from the target policy; and
        ``td_error``, ``target_value``, ``pred_value`` (``[*B]``, detached)."""
        action = self._get(tensordict, "action")
        if not self._tanh_normal:  # the critic sees actions within the bounds (Acme)
            action = torch.clamp(action, self.action_low, self.action_high)
        with torch.no_grad():
            next_value = self._target_policy_samples(tensordict.get("next"))["q"].mean(0)
            target = self._td_target(tensordict, next_value.unsqueeze(-1))
        outputs = self._qvalue_call.at_action(tensordict, self._qvalue_action_key, action)
        value = outputs[self.tensor_keys.state_action_value]
        return self._mpo_critic_loss(value, target, tensordict)
