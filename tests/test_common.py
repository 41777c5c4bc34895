"""rlloss.LossModule: TorchRL compatibility of keys, target networks and updaters."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch
import torchrl.objectives as torchrl_objectives
from tensordict import TensorDict
from torchrl.objectives import HardUpdate, SoftUpdate

import rlloss
from rlloss._checks import Coefficient, CoefficientOwner
from rlloss._keywords import TORCHRL_KEYWORDS, torchrl_keywords
from rlloss.offpolicy import TDTargetLoss
from tests.nets import make_actor, make_critic, rollout


class TargetRegressionLoss(TDTargetLoss):
    """A minimal loss holding a target network: regress V(s) on r + 0.9 V_target(s')."""

    @dataclasses.dataclass
    class _AcceptedKeys(TDTargetLoss._AcceptedKeys):
        value: str = "state_value"

    def __init__(self, critic):
        super().__init__(loss_function="l2", gamma=0.9)
        self.critic_network = critic
        self.target_critic = self._register_target_network("critic_network")

    def forward(self, tensordict):
        value = self.critic_network(tensordict.copy())[self.tensor_keys.value]
        with torch.no_grad():
            next_value = self.target_critic(tensordict.get("next"))[self.tensor_keys.value]
        loss = self._critic_loss(value, self._td_target(tensordict, next_value), tensordict)
        return TensorDict({"loss_value": loss}, [])


def test_is_a_torchrl_loss_module():
    assert isinstance(
        rlloss.ClipPPOLoss(make_actor(), make_critic()), torchrl_objectives.LossModule
    )


def step_online(loss):
    optimizer = torch.optim.SGD(loss.parameters(), lr=0.5)
    loss(rollout(make_actor()))["loss_value"].backward()
    optimizer.step()


def test_soft_update_moves_target_towards_online():
    loss = TargetRegressionLoss(make_critic())
    updater = SoftUpdate(loss, tau=0.25)
    online, target = loss.critic_network_params, loss.target_critic_network_params
    before = target.clone()
    step_online(loss)
    updater.step()
    for key, value in online.items(True, True):
        expected = 0.75 * before[key] + 0.25 * value.detach()
        torch.testing.assert_close(target[key], expected)
        assert not target[key].requires_grad


def test_hard_update_copies_every_interval():
    loss = TargetRegressionLoss(make_critic())
    updater = HardUpdate(loss, value_network_update_interval=2)
    step_online(loss)
    weight = ("module", "0", "weight")
    for _ in range(2):  # TorchRL's HardUpdate copies on the step after `interval` steps
        updater.step()
        assert not torch.equal(
            loss.target_critic_network_params[weight], loss.critic_network_params[weight]
        )
    updater.step()
    torch.testing.assert_close(
        loss.target_critic_network_params[weight], loss.critic_network_params[weight].detach()
    )


def test_target_parameters_are_buffers_outside_the_optimizer():
    loss = TargetRegressionLoss(make_critic())
    parameters = {id(p) for p in loss.parameters()}
    assert parameters == {id(p) for p in loss.critic_network.parameters()}
    target_ids = {id(t) for t in loss.target_critic_network_params.values(True, True)}
    assert not parameters & target_ids
    step_online(loss)
    assert all(t.grad is None for t in loss.target_critic_network_params.values(True, True))


def test_target_state_dict_round_trip():
    loss = TargetRegressionLoss(make_critic())
    updater = SoftUpdate(loss, tau=0.5)
    step_online(loss)
    updater.step()
    other = TargetRegressionLoss(make_critic())
    other.load_state_dict(loss.state_dict())
    for key, value in loss.target_critic_network_params.items(True, True):
        torch.testing.assert_close(other.target_critic_network_params[key], value)
    batch = rollout(make_actor())
    torch.testing.assert_close(loss(batch)["loss_value"], other(batch)["loss_value"])


def test_target_without_updater_warns_like_torchrl():
    loss = TargetRegressionLoss(make_critic())
    with pytest.warns(UserWarning, match="target network"):
        loss(rollout(make_actor()))


def test_updater_check_warns_until_an_updater_then_leaves():
    loss = TargetRegressionLoss(make_critic())
    batch = rollout(make_actor())
    for _ in range(2):  # it keeps warning while no updater is associated
        with pytest.warns(UserWarning, match="target network"):
            loss(batch)
    SoftUpdate(loss, tau=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss(batch)
    assert not loss._forward_pre_hooks  # the check cannot fire again: its hook is removed


def test_loss_without_target_has_no_forward_hook():
    assert not rlloss.ClipPPOLoss(make_actor(), make_critic())._forward_pre_hooks


def test_target_copy_follows_dtype_changes_and_updates():
    loss = TargetRegressionLoss(make_critic()).double()
    updater = HardUpdate(loss, value_network_update_interval=0)
    batch = rollout(make_actor()).double()
    with torch.no_grad():
        for parameter in loss.critic_network.parameters():
            parameter.add_(1.0)
    updater.step()
    outputs = loss.target_critic(batch.get("next"))["state_value"]
    assert outputs.dtype == torch.float64
    expected = loss.critic_network(batch.get("next").clone())["state_value"]
    torch.testing.assert_close(outputs, expected.detach())


def _ensemble_loss(critic_net, num):
    from torchrl.modules import ValueOperator

    class EnsembleLoss(TDTargetLoss):
        def __init__(self, critic):
            super().__init__(loss_function="l2")
            self.qvalue = self._register_ensemble("qvalue_network", critic, num, target=True)

        def forward(self, tensordict):
            inputs = {"observation": tensordict["observation"], "action": tensordict["action"]}
            return self.qvalue(inputs)["state_action_value"]

    return EnsembleLoss(ValueOperator(critic_net, in_keys=["observation", "action"]))


@pytest.mark.parametrize("activation", [torch.nn.Tanh, torch.nn.ReLU])
def test_mlp_ensemble_batched_matmuls_match_vmap(activation):
    """An MLP ensemble is evaluated with batched matrix products; it equals the vmap path in
    values and gradients, on a batch with two batch dims."""
    from torchrl.modules import MLP

    torch.manual_seed(0)
    net = MLP(in_features=5, out_features=1, num_cells=[8, 8], activation_class=activation)
    fast, slow = _ensemble_loss(net, 3), _ensemble_loss(net, 3)
    slow.load_state_dict(fast.state_dict())
    assert fast.qvalue.stacked is not None
    slow.qvalue.stacked = None  # force vmap
    batch = TensorDict(
        {"observation": torch.randn(4, 2, 3), "action": torch.randn(4, 2, 2)}, [4, 2]
    )
    out_fast, out_slow = fast(batch), slow(batch)
    assert out_fast.shape == (3, 4, 2, 1)
    torch.testing.assert_close(out_fast, out_slow)
    (out_fast * torch.arange(3.0).view(3, 1, 1, 1)).sum().backward()
    (out_slow * torch.arange(3.0).view(3, 1, 1, 1)).sum().backward()
    for (name, p_fast), p_slow in zip(fast.named_parameters(), slow.parameters(), strict=True):
        torch.testing.assert_close(p_fast.grad, p_slow.grad, msg=name)
    # the members differ (copies of one module are re-initialised) and member 0 got no gradient
    weights = fast.qvalue_network_params["module", "0", "weight"]
    assert not torch.equal(weights[0], weights[1])
    assert weights.grad[0].abs().sum() == 0


def test_non_mlp_ensemble_gives_each_members_output():
    """A member with a layer other than Linear and an activation (here LayerNorm) is not
    stacked into batched matrix products, and gives each member's own output."""
    from torchrl.modules import MLP

    torch.manual_seed(0)
    net = MLP(
        in_features=5,
        out_features=1,
        num_cells=[8],
        norm_class=torch.nn.LayerNorm,
        norm_kwargs={"normalized_shape": 8},
    )
    loss = _ensemble_loss(net, 2)
    assert loss.qvalue.stacked is None
    batch = TensorDict({"observation": torch.randn(6, 3), "action": torch.randn(6, 2)}, [6])
    values = loss(batch)
    members = loss.qvalue_network_params
    inputs = torch.cat([batch["observation"], batch["action"]], -1)
    for i in range(2):
        with members[i]["module"].to_module(net):
            torch.testing.assert_close(values[i], net(inputs))


class _BatchNormCritic(torch.nn.Module):
    """A custom critic (inputs concatenated in ``forward``) with a BatchNorm layer."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(5, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )

    def forward(self, observation, action):
        return self.layers(torch.cat([observation, action], -1))


@pytest.mark.parametrize("num, by_work", [(2, False), (3, False), (6, False), (6, True)])
def test_per_member_ensemble_calls_match_vmap(monkeypatch, num, by_work):
    """Small ensembles of a custom module run one member at a time, large ones through vmap
    unless each member's work (rows x member tensor elements) reaches ``LOOP_WORK_MIN``
    (``by_work``: the threshold at the work, or one above): the same values, gradients and
    running-statistics updates (BatchNorm in train mode)."""
    import rlloss._ensembles

    torch.manual_seed(0)
    looped, vmapped = (
        _ensemble_loss(_BatchNormCritic(), num),
        _ensemble_loss(_BatchNormCritic(), num),
    )
    vmapped.load_state_dict(looped.state_dict())
    batch = TensorDict({"observation": torch.randn(16, 3), "action": torch.randn(16, 2)}, [16])
    weights = torch.arange(1.0, num + 1).view(num, 1, 1)  # a different gradient per member
    work = 16 * looped.qvalue.member_size
    assert looped.qvalue.member_size == 48 + 33 + 9  # Linear(5, 8), BatchNorm1d(8), Linear(8, 1)
    turns = []
    monkeypatch.setattr(
        rlloss._ensembles,
        "members_in_turn",
        lambda *args, call=rlloss._ensembles.members_in_turn: turns.append(1) or call(*args),
    )
    outputs = {}
    for name, loss, limit in (("loop", looped, num), ("vmap", vmapped, num - 1)):
        monkeypatch.setattr(rlloss._ensembles, "LOOP_MEMBERS_MAX", num - 1 if by_work else limit)
        threshold = work if by_work and name == "loop" else work + 1
        monkeypatch.setattr(rlloss._ensembles, "LOOP_WORK_MIN", threshold)
        turns.clear()
        outputs[name] = loss(batch)
        assert turns == ([1] if name == "loop" else []), name
        (outputs[name] * weights).sum().backward()
    assert outputs["loop"].shape == (num, 16, 1)
    torch.testing.assert_close(outputs["loop"], outputs["vmap"])
    for (name, p_loop), p_vmap in zip(looped.named_parameters(), vmapped.parameters(), strict=True):
        torch.testing.assert_close(p_loop.grad, p_vmap.grad, msg=name)
    stats = looped.qvalue_network_params["module", "layers", "1", "running_mean"]
    assert not torch.equal(stats[0], stats[1])  # each member updated its own statistics
    for key, value in looped.qvalue_network_params.items(True, True):
        torch.testing.assert_close(value, vmapped.qvalue_network_params[key], msg=str(key))


def test_deepcopy_is_independent_of_the_original():
    """A deep copy's source, target and detached views are its own tensors: changing the
    original's weights leaves the copy's outputs and target updates alone."""
    import copy

    from tests.test_updaters import sac_loss, td3_loss

    for make in (sac_loss, td3_loss):
        torch.manual_seed(0)
        original = make()
        clone = copy.deepcopy(original)
        batch = TensorDict(
            {
                "observation": torch.randn(5, 4),
                "action": torch.rand(5, 2) * 2 - 1,
                "next": {
                    "observation": torch.randn(5, 4),
                    "reward": torch.randn(5, 1),
                    "terminated": torch.zeros(5, 1, dtype=torch.bool),
                    "done": torch.zeros(5, 1, dtype=torch.bool),
                },
            },
            [5],
        )
        torch.manual_seed(1)
        before = clone(batch.clone())["loss_qvalue"]
        with torch.no_grad():
            for p in original.parameters():
                p.add_(1.0)
        torch.manual_seed(1)
        torch.testing.assert_close(clone(batch.clone())["loss_qvalue"], before)
        rlloss.SoftUpdate(clone, tau=1.0).step()  # targets <- the copy's own weights
        for key, value in clone.state_dict().items():
            if key.startswith("target_actor_network_params."):
                online = clone.state_dict()[
                    key.replace("target_actor_network_params.", "actor_network.")
                ]
                torch.testing.assert_close(value, online)


def test_per_member_ensemble_compiles_without_graph_breaks():
    """Under ``torch.compile(fullgraph=True)`` the members run through ``functional_call`` (the
    eager path swaps the tensors in place): the same values."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    loss = _ensemble_loss(_BatchNormCritic(), 2).eval()  # eval: running statistics, no update
    batch = TensorDict({"observation": torch.randn(16, 3), "action": torch.randn(16, 2)}, [16])
    compiled = torch.compile(loss, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(batch), loss(batch))
    torch._dynamo.reset()


# ----------------------------------------------------------------------------- coefficients
class _Scheduled(CoefficientOwner, torch.nn.Module):
    rate = Coefficient(low=0.0, high=1.0, buffer=True)
    steps = Coefficient(low=1, integer=True)
    bound = Coefficient(low=0.0, low_open=True, buffer=True)
    free = Coefficient(buffer=True)

    def __init__(self, bound=None):
        super().__init__()
        self._register_coefficients(rate=0.5, steps=2, bound=bound, free=-1.0)


def test_coefficient_checks_every_assignment_and_writes_numbers_in_place():
    module = _Scheduled()
    buffer = module.rate
    assert list(module.state_dict()) == ["rate", "free"]  # bound is None: a plain attribute
    module.rate = 0.25
    assert module.rate is buffer and float(buffer) == 0.25
    with pytest.raises(ValueError, match=r"rate must be in \[0.0, 1.0\], got 1.5"):
        module.rate = 1.5
    with pytest.raises(ValueError, match="steps must be an integer"):
        module.steps = 2.5
    module.steps = 3.0
    assert module.steps == 3 and type(module.steps) is int
    module.free = math.nan  # no range: not checked
    assert math.isnan(float(module.free))
    replacement = torch.tensor(0.75)
    module.rate = replacement  # a tensor replaces the buffer (nn.Module's rule, TorchRL's)
    assert module.rate is replacement and "rate" in module.state_dict()
    with pytest.raises(ValueError, match="bound must be in"):
        _Scheduled(bound=0.0)


def test_coefficient_none_parameter_and_class_access():
    module = _Scheduled()
    assert module.bound is None
    module.bound = 0.5  # no buffer to write into: a plain number, as TorchRL's optional buffers
    assert module.bound == 0.5 and "bound" not in module.state_dict()
    module.free = torch.nn.Parameter(torch.tensor(1.0))  # a parameter may hold the name
    assert isinstance(module.free, torch.nn.Parameter) and "free" in dict(module.named_parameters())
    assert isinstance(_Scheduled.rate, Coefficient)
    assert set(_Scheduled._coefficients()) == {"rate", "steps", "bound", "free"}
    with pytest.raises(AttributeError, match="no attribute 'steps'"):
        _ = _Scheduled.__new__(_Scheduled).steps  # before nn.Module.__init__ too


def test_coefficient_plain_values_are_not_stored_under_their_own_name():
    """torch 2.11's dynamo reads ``module.__dict__[name]`` as ``getattr(module, name)``: a plain
    value stored under the attribute's own name sent the descriptor into itself without end
    under ``torch.compile`` (seen on an H200 with torch 2.11); it is stored under another key."""
    module = _Scheduled()
    module.bound = 0.5
    assert "steps" not in vars(module) and "bound" not in vars(module)
    assert module.steps == 2 and module.bound == 0.5

    def read(x):
        return x * module.bound * module.steps * module.rate

    compiled = torch.compile(read, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(torch.ones(2)), read(torch.ones(2)))
    torch._dynamo.reset()


def test_losses_list_their_buffer_coefficients_for_torchrl():
    assert {"entropy_coeff", "critic_coeff", "clip_value", "clip_epsilon", "dual_clip"} <= (
        rlloss.ClipPPOLoss._all_schedulable_buffers
    )
    assert "samples_mc_entropy" not in rlloss.ClipPPOLoss._all_schedulable_buffers
    assert {"log_alpha", "target_entropy"} <= rlloss.SACLoss._all_schedulable_buffers


# ----------------------------------------------------------------------------- TorchRL keywords
class _Owner:
    pass


@pytest.mark.parametrize(
    "given, error, message",
    [
        ({"entropy_coef": None}, TypeError, "'entropy_coef' has been removed in torchrl v0.11"),
        ({"priority_key": "p"}, RuntimeError, r"_Owner: .*set_keys\(priority='p'\)"),
        ({"gamma": 0.9}, TypeError, "_Owner: gamma is not a loss argument"),
        ({"clip_epsilon": 0.2}, TypeError, r"unexpected keyword argument\(s\) \['clip_epsilon'\]"),
    ],
)
def test_torchrl_keywords_refusals(given, error, message):
    translated = ("entropy_coef", "priority_key", "gamma")
    with pytest.raises(error, match=message):
        torchrl_keywords(_Owner(), given, accepted=("reduction",), translated=translated)


def test_torchrl_keywords_aliases_and_ignored_keywords():
    owner = _Owner()
    given = {"actor_network": None, "actor": "net", "critic": None, "priority_key": None}
    translated = ("actor", "critic", "priority_key", "deactivate_vmap")
    taken = torchrl_keywords(owner, given, accepted=("actor_network",), translated=translated)
    assert taken == {"actor_network": "net"}  # a None alias or removed key: not given
    assert owner.deactivate_vmap is False  # ignored, kept with TorchRL's default
    torchrl_keywords(owner, {"deactivate_vmap": True}, (), ("deactivate_vmap",))
    assert owner.deactivate_vmap is True
    assert {rule for rule, _ in TORCHRL_KEYWORDS.values()} == {
        "alias",
        "renamed",
        "key",
        "refused",
        "ignored",
    }


def test_no_grad_member_views_follow_the_stacked_tensors():
    """The target and detached members' views are kept between calls: they follow in-place
    updates of the stacked tensors (a soft update, an optimiser step) and are made again when a
    stacked tensor gets new storage (``.data`` assigned); each call equals a fresh ensemble's."""
    torch.manual_seed(0)
    loss = _ensemble_loss(_BatchNormCritic().eval(), 2)
    assert loss.qvalue.stacked is None
    inputs = {"observation": torch.randn(6, 3), "action": torch.randn(6, 2)}

    def expected(params):
        fresh = _ensemble_loss(_BatchNormCritic().eval(), 2)
        fresh.qvalue_network_params.update_(params)
        return fresh.qvalue(inputs)["state_action_value"]

    for kwargs, params in (
        ({"target": True}, loss.target_qvalue_network_params),
        ({"detach": True}, loss.qvalue_network_params),
    ):
        first = loss.qvalue(inputs, **kwargs)["state_action_value"]
        torch.testing.assert_close(first, expected(params))
        weight = params["module", "layers", "0", "weight"]
        with torch.no_grad():
            weight.mul_(0.5)  # in place: the kept views see it
        second = loss.qvalue(inputs, **kwargs)["state_action_value"]
        assert not torch.equal(first, second)
        torch.testing.assert_close(second, expected(params))
        weight.data = weight.data * 2.0  # new storage: the views are made again
        third = loss.qvalue(inputs, **kwargs)["state_action_value"]
        torch.testing.assert_close(third, expected(params))
        torch.testing.assert_close(third, first)
    assert not loss.qvalue(inputs, detach=True)["state_action_value"].requires_grad
