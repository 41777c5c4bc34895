"""The estimators' shifted value call (TorchRL's ``shifted=True``), ``skip_existing``, the
value-call options and the other keywords TorchRL's estimators take: a naive reference of the
shifted layout, the unshifted path as identity where the two must agree, and TorchRL parity."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, set_skip_existing
from torch import nn
from torchrl.modules import GRUModule, set_recurrent_mode
from torchrl.objectives import value as torchrl_value

import rlloss
from rlloss._checks import MissingKeyError
from tests import reference as ref

OBS = 3


def linear_critic(dtype=torch.float64) -> TensorDictModule:
    torch.manual_seed(1)
    return TensorDictModule(nn.Linear(OBS, 1, dtype=dtype), ["obs"], ["state_value"])


def batch_with(done_steps, truncated_steps, rows=3, steps=8, dtype=torch.float64, seed=0):
    """``[rows, steps]`` of a consistent rollout (``("next", "obs")[t] = obs[t + 1]`` inside an
    episode, a fresh observation where an episode ends), terminations at ``done_steps`` and
    truncations at ``truncated_steps`` (``{row: [steps]}``), the last step done (truncated)."""
    g = torch.Generator().manual_seed(seed)
    chain = torch.randn(rows, steps + 1, OBS, generator=g, dtype=dtype)
    obs, next_obs = chain[:, :-1].clone(), chain[:, 1:].clone()
    done = torch.zeros(rows, steps, 1, dtype=torch.bool)
    terminated = torch.zeros_like(done)
    for row, ends in done_steps.items():
        done[row, ends] = terminated[row, ends] = True
    for row, ends in truncated_steps.items():
        done[row, ends] = True
        next_obs[row, ends] = torch.randn(len(ends), OBS, generator=g, dtype=dtype)
    done[:, -1] = True
    reward = torch.randn(rows, steps, 1, generator=g, dtype=dtype)
    flags = {"done": done, "terminated": terminated, "reward": reward}
    return TensorDict({"obs": obs, "next": {"obs": next_obs, **flags}}, [rows, steps])


def naive_shifted_gae(batch, critic, gamma, lmbda, budget):
    """The shifted estimator written out one row at a time: the sequence of inputs (each step's
    input, then its next input after a truncation before the last step and after the last step,
    cut at ``T + budget`` slots), V over it, each kept step's ``V(s')`` at the slot after its
    own, the last kept step bootstrapped with its trace cut, GAE over the kept steps."""
    rows, steps = batch.shape
    advantage = torch.zeros(rows, steps, 1, dtype=torch.float64)
    target = torch.zeros_like(advantage)
    kept = torch.zeros(rows, steps, dtype=torch.bool)
    for row in range(rows):
        done = batch["next", "done"][row, :, 0].tolist()
        terminated = batch["next", "terminated"][row, :, 0].tolist()
        sequence, slot_of = [], []
        for t in range(steps):
            slot_of.append(len(sequence))
            sequence.append(batch["obs"][row, t])
            if t < steps - 1 and done[t] and not terminated[t]:
                sequence.append(batch["next", "obs"][row, t])
        sequence.append(batch["next", "obs"][row, steps - 1])
        length = steps + budget
        n_kept = sum(slot + 1 < length for slot in slot_of)
        if n_kept < steps:  # the last kept step's own next input
            sequence[slot_of[n_kept - 1] + 1] = batch["next", "obs"][row, n_kept - 1]
        with torch.no_grad():
            values = critic.module(torch.stack(sequence[:length]))[:, 0].tolist()
        value = [values[slot_of[t]] for t in range(n_kept)]
        next_value = [values[slot_of[t] + 1] for t in range(n_kept)]
        done_kept = [float(d) for d in done[:n_kept]]
        term_kept = [float(x) for x in terminated[:n_kept]]
        done_kept[-1], term_kept[-1] = 1.0, term_kept[-1] if n_kept == steps else 0.0
        reward = batch["next", "reward"][row, :n_kept, 0].tolist()
        adv = ref.gae(reward, value, next_value, done_kept, term_kept, gamma, lmbda)
        advantage[row, :n_kept, 0] = torch.tensor(adv, dtype=torch.float64)
        target[row, :n_kept, 0] = torch.tensor(adv, dtype=torch.float64) + torch.tensor(value)
        kept[row, :n_kept] = True
    return advantage, target, kept


TRUNCATIONS = {0: [1, 4], 2: [2]}
TERMINATIONS = {1: [3], 2: [5]}


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_shifted_gae_matches_a_naive_reference_and_torchrl(budget):
    batch = batch_with(TERMINATIONS, TRUNCATIONS)
    critic = linear_critic()
    kwargs = {"gamma": 0.9, "lmbda": 0.8, "shifted": True, "shifted_budget": budget}
    out = rlloss.GAE(value_network=critic, **kwargs)(batch.clone())
    advantage, target, kept = naive_shifted_gae(batch, critic, 0.9, 0.8, budget)
    assert out["shifted_valid"].equal(kept)
    assert (~kept).sum() == sum(max(len(v) + 1 - budget, 0) for v in TRUNCATIONS.values())
    torch.testing.assert_close(out["advantage"], advantage)
    torch.testing.assert_close(out["value_target"], target)
    theirs = torchrl_value.GAE(value_network=critic, **kwargs)(batch.clone())
    for key in ("advantage", "value_target", "shifted_valid"):
        torch.testing.assert_close(out[key], theirs[key], msg=str(key))


@pytest.mark.parametrize("name", ["GAE", "TD0Estimator", "TD1Estimator", "TDLambdaEstimator"])
def test_shifted_equals_unshifted_on_a_feed_forward_critic_when_every_step_fits(name):
    """No truncation before the last step (terminations only), or a budget of one more than the
    truncations: the single call gives every step the values of the two unshifted calls."""
    kwargs = {"gamma": 0.9} | ({} if name in ("TD0Estimator", "TD1Estimator") else {"lmbda": 0.7})
    critic = linear_critic()
    for batch, budget in ((batch_with(TERMINATIONS, {}), 1), (batch_with({}, TRUNCATIONS), 3)):
        estimator = getattr(rlloss, name)
        shifted = estimator(value_network=critic, shifted=True, shifted_budget=budget, **kwargs)
        out = shifted(batch.clone())
        plain = estimator(value_network=critic, **kwargs)(batch.clone())
        assert out["shifted_valid"].all()
        for key in ("advantage", "value_target", "state_value", ("next", "state_value")):
            torch.testing.assert_close(out[key], plain[key], msg=str(key))


@pytest.mark.parametrize("name", ["TD0Estimator", "TDLambdaEstimator", "MultiAgentGAE"])
def test_shifted_estimators_match_torchrl(name):
    kwargs = {"gamma": 0.9, "shifted": True} | ({} if name == "TD0Estimator" else {"lmbda": 0.7})
    batch = batch_with(TERMINATIONS, TRUNCATIONS)
    critic = linear_critic()
    if name == "MultiAgentGAE":  # three agents' values, team flags
        batch["obs"] = batch["obs"].unsqueeze(-2).expand(3, 8, 4, OBS) * torch.rand(4, 1)
        batch["next", "obs"] = batch["next", "obs"].unsqueeze(-2).expand(3, 8, 4, OBS).clone()
        kwargs["average_gae"] = True
    ours = getattr(rlloss, name)(value_network=critic, **kwargs)(batch.clone())
    theirs = getattr(torchrl_value, name)(value_network=critic, **kwargs)(batch.clone())
    for key in ("advantage", "value_target", "shifted_valid"):
        torch.testing.assert_close(ours[key], theirs[key], msg=str(key))


def test_shifted_average_gae_standardises_over_kept_steps_only():
    batch = batch_with(TERMINATIONS, TRUNCATIONS)
    critic = linear_critic()
    out = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic, shifted=True, average_gae=True)(
        batch.clone()
    )
    raw = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic, shifted=True)(batch.clone())
    kept = out["shifted_valid"]
    assert not kept.all()
    values = raw["advantage"][kept]
    expected = (values - values.mean()) / values.std(unbiased=False)
    torch.testing.assert_close(out["advantage"][kept], expected)
    assert (out["advantage"][~kept] == 0).all() and (out["value_target"][~kept] == 0).all()


def test_shifted_without_next_observations_uses_each_steps_own_input():
    """Without ``("next", obs)``: each step's successor is its next input, and at truncations
    and the last step the step's own input stands in (TorchRL's fallback)."""
    batch = batch_with(TERMINATIONS, TRUNCATIONS)
    critic = linear_critic()
    stand_in = batch.clone()
    stand_in["next", "obs"] = batch["obs"].clone()
    missing = batch.clone()
    del missing["next", "obs"]
    estimator = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic, shifted=True)
    out = estimator(missing)
    expected = estimator(stand_in)
    assert ("next", "obs") not in missing.keys(True)
    for key in ("advantage", "value_target", "shifted_valid"):
        torch.testing.assert_close(out[key], expected[key], msg=str(key))


def recurrent_batch(rows=2, steps=9, hidden=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = batch_with({1: [2]}, {0: [3, 5], 1: [6]}, rows=rows, steps=steps, seed=seed)
    done = batch["next", "done"]
    is_init = torch.zeros_like(done)
    is_init[:, 0] = True
    is_init[:, 1:] = done[:, :-1]
    batch["is_init"], batch["next", "is_init"] = is_init, done.clone()
    batch["rs_h"] = torch.randn(rows, steps, 1, hidden, generator=g, dtype=torch.float64)
    batch["next", "rs_h"] = torch.randn(rows, steps, 1, hidden, generator=g, dtype=torch.float64)
    return batch


def recurrent_critic(hidden=4):
    torch.manual_seed(2)
    gru = GRUModule(
        input_size=OBS,
        hidden_size=hidden,
        in_keys=["obs", "rs_h"],
        out_keys=["features", ("next", "rs_h")],
        python_based=True,
    ).to(torch.float64)
    head = TensorDictModule(
        nn.Linear(hidden, 1, dtype=torch.float64), ["features"], ["state_value"]
    )
    from tensordict.nn import TensorDictSequential

    return TensorDictSequential(gru, head)


@pytest.mark.parametrize("budget", [1, 3])
def test_shifted_recurrent_critic_matches_torchrl(budget):
    """A recurrent critic in recurrent mode: one call along the steps with the truncations'
    next inputs (and their stored states, restarted by the merged ``is_init``) inserted."""
    batch, critic = recurrent_batch(), recurrent_critic()
    kwargs = {"gamma": 0.9, "lmbda": 0.8, "shifted": True, "shifted_budget": budget}
    with set_recurrent_mode(True), torch.no_grad():
        ours = rlloss.GAE(value_network=critic, **kwargs)(batch.clone())
        theirs = torchrl_value.GAE(value_network=critic, **kwargs)(batch.clone())
    for key in ("advantage", "value_target", "shifted_valid"):
        torch.testing.assert_close(ours[key], theirs[key], msg=str(key))


def test_shifted_options_are_checked():
    critic = linear_critic()
    with pytest.raises(ValueError, match="shifted must be a boolean"):
        rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, shifted="yes")
    with pytest.raises(ValueError, match="shifted_budget must be >= 1"):
        rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, shifted=True, shifted_budget=0)
    estimator = rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, shifted=True)
    params = TensorDict.from_module(critic)
    batch = batch_with(TERMINATIONS, TRUNCATIONS)
    with pytest.raises(ValueError, match="one set of weights"):
        estimator(batch, params=params, target_params=params.clone())
    out = estimator(batch.clone(), params=params)  # one set: the single call uses it
    torch.testing.assert_close(out["advantage"], estimator(batch.clone())["advantage"])


def test_a_shifted_valid_entry_in_the_batch_is_applied_as_torchrl_applies_it():
    batch = batch_with(TERMINATIONS, TRUNCATIONS)
    batch["shifted_valid"] = torch.ones(3, 8, dtype=torch.bool)
    batch["shifted_valid"][0, 6:] = False
    critic = linear_critic()
    ours = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic)(batch.clone())
    theirs = torchrl_value.GAE(gamma=0.9, lmbda=0.8, value_network=critic)(batch.clone())
    assert (ours["advantage"][0, 6:] == 0).all()
    torch.testing.assert_close(ours["advantage"], theirs["advantage"])
    torch.testing.assert_close(ours["value_target"], theirs["value_target"])


@pytest.mark.parametrize("shifted", [False, True])
def test_skip_existing_none_follows_tensordicts_setting(shifted):
    batch = batch_with(TERMINATIONS, {})
    batch["state_value"] = torch.ones(3, 8, 1, dtype=torch.float64)
    batch["next", "state_value"] = torch.ones(3, 8, 1, dtype=torch.float64)
    critic = linear_critic()
    follows = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic, shifted=shifted)
    forced = rlloss.GAE(
        gamma=0.9, lmbda=0.8, value_network=critic, shifted=shifted, skip_existing=False
    )
    with set_skip_existing(True):
        assert (follows(batch.clone())["state_value"] == 1).all()
        assert not (forced(batch.clone())["state_value"] == 1).all()
    assert not (follows(batch.clone())["state_value"] == 1).all()
    kept = rlloss.GAE(
        gamma=0.9, lmbda=0.8, value_network=critic, shifted=shifted, skip_existing=True
    )
    assert (kept(batch.clone())["state_value"] == 1).all()


def test_value_chunk_options_are_checked_as_torchrl_checks_them():
    critic = linear_critic()
    with pytest.raises(ValueError, match="value_chunk_size and num_chunks"):
        rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, value_chunk_size=2, num_chunks=2)
    with pytest.raises(ValueError, match="num_chunks and num_chunk"):
        rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, num_chunks=2, num_chunk=3)
    with pytest.raises(ValueError, match="num_chunks must be >= 1"):
        rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, num_chunks=0)
    with pytest.raises(TypeError, match="value_chunk_dim must be an integer"):
        rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, value_chunk_dim=1.0)
    same = rlloss.GAE(gamma=0.9, lmbda=0.9, value_network=critic, num_chunks=2, num_chunk=2)
    assert same.num_chunks == 2
    wrong_dim = rlloss.GAE(
        gamma=0.9, lmbda=0.9, value_network=critic, num_chunks=2, value_chunk_dim=2
    )
    with pytest.raises(ValueError, match=r"value_chunk_dim=2 is out of bounds .* \[-2, 2\)"):
        wrong_dim(batch_with(TERMINATIONS, {}))


@pytest.mark.parametrize(
    "chunks", [{"num_chunks": 3}, {"value_chunk_size": 2, "value_chunk_dim": 1}]
)
def test_chunked_shifted_call_equals_the_unchunked_one(chunks):
    batch = batch_with(TERMINATIONS, TRUNCATIONS)
    critic = linear_critic()
    whole = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic, shifted=True)(batch.clone())
    cut = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic, shifted=True, **chunks)
    out = cut(batch.clone())
    torch.testing.assert_close(out["advantage"], whole["advantage"])


def test_time_dim_named_time_is_used():
    batch = batch_with(TERMINATIONS, TRUNCATIONS)
    critic = linear_critic()
    expected = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic)(batch.clone())
    swapped = batch.clone().transpose(0, 1).refine_names("time", None)
    out = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic)(swapped)
    torch.testing.assert_close(out["advantage"].transpose(0, 1), expected["advantage"])


def test_auto_reset_env_matches_torchrl():
    batch = batch_with(TERMINATIONS, TRUNCATIONS)
    batch["next", "truncated"] = batch["next", "done"] & ~batch["next", "terminated"]
    critic = linear_critic()
    kwargs = {"gamma": 0.9, "lmbda": 0.8, "value_network": critic, "auto_reset_env": True}
    ours = rlloss.GAE(**kwargs)(batch.clone())
    theirs = torchrl_value.GAE(**kwargs)(batch.clone())
    torch.testing.assert_close(ours["advantage"], theirs["advantage"])
    torch.testing.assert_close(ours["value_target"], theirs["value_target"])
    plain = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic)(batch.clone())
    assert not torch.allclose(ours["advantage"], plain["advantage"])
    del batch["next", "truncated"]
    with pytest.raises(MissingKeyError, match="auto_reset_env"):
        rlloss.GAE(**kwargs)(batch)


def test_vtrace_average_adv_standardises_the_advantage():
    from tests.nets import make_actor, make_critic, rollout

    actor, critic = make_actor("categorical"), make_critic()
    batch = rollout(actor, batch_size=(4, 6))
    plain = rlloss.VTrace(gamma=0.9, actor_network=actor, value_network=critic)(batch.clone())
    out = rlloss.VTrace(gamma=0.9, actor_network=actor, value_network=critic, average_adv=True)(
        batch.clone()
    )
    advantage = plain["advantage"]
    expected = (advantage - advantage.mean()) / advantage.std()
    torch.testing.assert_close(out["advantage"], expected)
    torch.testing.assert_close(out["value_target"], plain["value_target"])


def multi_agent_batch(agents=3):
    flags = torch.zeros(2, 4, 1, dtype=torch.bool)

    def agent_td():
        return TensorDict({"obs": torch.randn(2, 4, agents, OBS)}, [2, 4, agents])

    return TensorDict(
        {
            "agents": agent_td(),
            "next": {
                "agents": agent_td(),
                "reward": torch.randn(2, 4, 1),
                "done": flags,
                "terminated": flags,
            },
        },
        [2, 4],
    )


def test_multi_agent_gae_refuses_an_agent_dim_outside_the_values():
    critic = TensorDictModule(nn.Linear(OBS, 1), [("agents", "obs")], [("agents", "state_value")])
    for agent_dim in (5, -5):
        estimator = rlloss.MultiAgentGAE(
            gamma=0.9, lmbda=0.9, value_network=critic, agent_dim=agent_dim
        )
        estimator.set_keys(value=("agents", "state_value"))
        with pytest.raises(ValueError, match=f"agent_dim={agent_dim}") as error:
            estimator(multi_agent_batch())
        assert "4 dims" in str(error.value) and "[-4, 4)" in str(error.value)


@pytest.mark.parametrize("name", ["MultiAgentGAE", "GAE", "TD0Estimator"])
def test_a_critic_writing_elsewhere_is_named(name):
    critic = TensorDictModule(nn.Linear(OBS, 1), [("agents", "obs")], [("agents", "state_value")])
    kwargs = {"gamma": 0.9} | ({} if name == "TD0Estimator" else {"lmbda": 0.9})
    estimator = getattr(rlloss, name)(value_network=critic, **kwargs)
    with pytest.raises(MissingKeyError) as error:
        estimator(multi_agent_batch())
    message = str(error.value)
    assert "TensorDictModule" in message and "('agents', 'state_value')" in message
    assert "set_keys(value=" in message


def test_removed_key_keywords_keep_torchrls_error():
    for keyword in ("advantage_key", "value_target_key", "value_key"):
        with pytest.raises(RuntimeError, match="via constructor is deprecated"):
            rlloss.GAE(gamma=0.9, lmbda=0.9, **{keyword: "x"})


def test_for_loss_takes_the_losss_critic_unless_given():
    critic, other = linear_critic(), linear_critic()

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.critic_network = critic
            self.actor_network = None

    gae = rlloss.GAE.for_loss(Loss(), gamma=0.9, lmbda=0.9)
    assert isinstance(gae, rlloss.GAE) and gae.value_network is critic
    given = rlloss.TD0Estimator.for_loss(Loss(), gamma=0.9, value_network=other)
    assert given.value_network is other


def test_shifted_vtrace_keeps_every_step_without_truncations_and_drops_after_them():
    from tests.nets import make_actor, make_critic, rollout

    actor, critic = make_actor("categorical"), make_critic()
    batch = rollout(actor, batch_size=(2, 6))
    batch["next", "done"] = torch.zeros(2, 6, 1, dtype=torch.bool)
    batch["next", "terminated"] = torch.zeros(2, 6, 1, dtype=torch.bool)
    batch["next", "observation"][:, :-1] = batch["observation"][:, 1:]
    kwargs = {"gamma": 0.9, "actor_network": actor, "value_network": critic}
    plain = rlloss.VTrace(**kwargs)(batch.clone())
    out = rlloss.VTrace(shifted=True, **kwargs)(batch.clone())
    assert out["shifted_valid"].all()
    torch.testing.assert_close(out["advantage"], plain["advantage"])
    batch["next", "done"][0, 2] = True  # a truncation: the last step of row 0 no longer fits
    out = rlloss.VTrace(shifted=True, **kwargs)(batch.clone())
    assert out["shifted_valid"].sum() == 11 and not out["shifted_valid"][0, -1]
    assert out["advantage"][0, -1].eq(0).all()


def test_shifted_gae_compiles_fullgraph_and_matches_eager():
    critic = linear_critic()
    gae = rlloss.GAE(gamma=0.9, lmbda=0.8, value_network=critic, shifted=True)
    compiled = torch.compile(gae, fullgraph=True)
    for seed in (0, 1):
        batch = batch_with(TERMINATIONS, TRUNCATIONS, seed=seed)
        out, expected = compiled(batch.clone()), gae(batch.clone())
        for key in ("advantage", "value_target", "shifted_valid"):
            torch.testing.assert_close(out[key], expected[key], msg=str(key))
