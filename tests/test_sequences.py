"""Sequence batches of recurrent policies (TorchRL's LSTMModule / GRUModule in recurrent mode):
the chunker against a hand-written reference, GAE and the PPO family against a step-by-step
reference that drives the raw ``nn.LSTM`` / ``nn.GRU``, a chunked update against the unchunked
one, and gradients that never cross an episode boundary."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import (
    GRUModule,
    IndependentNormal,
    LSTMModule,
    ProbabilisticActor,
    ValueOperator,
    set_recurrent_mode,
)

import rlloss
from rlloss._distribution_calls import DistributionCall
from rlloss._networks import NetworkCall
from tests import reference as ref

OBS, HIDDEN, ACTIONS = 3, 8, 2
GAMMA, LMBDA = 0.9, 0.8
MASK = ("collector", "mask")


# ----------------------------------------------------------------------------- networks
def rnn(cell: str, name: str) -> LSTMModule | GRUModule:
    """An LSTMModule / GRUModule reading "observation" with its own state entries."""
    if cell == "lstm":
        return LSTMModule(
            input_size=OBS,
            hidden_size=HIDDEN,
            in_keys=["observation", f"{name}_h", f"{name}_c", "is_init"],
            out_keys=[f"{name}_x", ("next", f"{name}_h"), ("next", f"{name}_c")],
        )
    return GRUModule(
        input_size=OBS,
        hidden_size=HIDDEN,
        in_keys=["observation", f"{name}_h", "is_init"],
        out_keys=[f"{name}_x", ("next", f"{name}_h")],
    )


def recurrent_actor(cell: str, kind: str = "categorical") -> ProbabilisticActor:
    if kind == "categorical":
        head = TensorDictModule(nn.Linear(HIDDEN, ACTIONS), ["actor_x"], ["logits"])
        return ProbabilisticActor(
            TensorDictSequential(rnn(cell, "actor"), head),
            in_keys=["logits"],
            distribution_class=torch.distributions.Categorical,
            return_log_prob=True,
        )
    head = TensorDictModule(ScaledNormalHead(), ["actor_x"], ["loc", "scale"])
    return ProbabilisticActor(
        TensorDictSequential(rnn(cell, "actor"), head),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )


class ScaledNormalHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(HIDDEN, 2 * ACTIONS)

    def forward(self, x):
        loc, scale = self.linear(x).chunk(2, -1)
        return loc, nn.functional.softplus(scale) + 0.1


def recurrent_critic(cell: str) -> TensorDictSequential:
    return TensorDictSequential(
        rnn(cell, "critic"), ValueOperator(nn.Linear(HIDDEN, 1), in_keys=["critic_x"])
    )


def state_keys(cell: str) -> list[str]:
    suffixes = ["h", "c"] if cell == "lstm" else ["h"]
    return [f"{name}_{s}" for name in ("actor", "critic") for s in suffixes]


# ----------------------------------------------------------------------------- data
def collect(actor, critic, cell: str, starts: list[list[int]], time: int, seed: int = 0):
    """A rollout ``[B, T]`` as a collector stores it: the networks stepped one step at a time
    (sequential mode) from the states they ended the previous step with, zeroed where an episode
    starts (``starts[b]``: the steps of row b with ``is_init``). ``("next", "observation")`` is the
    following observation inside an episode; the step before a start ends its episode, truncated
    at even steps, terminated at odd ones."""
    generator = torch.Generator().manual_seed(seed)
    rows = len(starts)
    observation = torch.randn(rows, time, OBS, generator=generator)
    is_init = torch.zeros(rows, time, 1, dtype=torch.bool)
    for row, row_starts in enumerate(starts):
        is_init[row, row_starts] = True
    done = torch.zeros(rows, time, 1, dtype=torch.bool)
    done[:, :-1] = is_init[:, 1:]
    terminated = done & (torch.arange(time).view(1, -1, 1) % 2 == 1)
    final = torch.randn(rows, time, OBS, generator=generator)
    next_observation = torch.where(done, final, observation.roll(-1, 1))
    next_observation[:, -1] = final[:, -1]
    keys = state_keys(cell)
    carry = {key: torch.zeros(rows, 1, HIDDEN) for key in keys}
    steps = []
    torch.manual_seed(seed)
    for t in range(time):
        td = TensorDict(
            {"observation": observation[:, t], "is_init": is_init[:, t], **carry},
            batch_size=[rows],
        )
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            actor(td)
            critic(td)
        td["next"].update(
            {
                "observation": next_observation[:, t],
                "reward": torch.randn(rows, 1, generator=generator),
                "done": done[:, t],
                "terminated": terminated[:, t],
                "is_init": torch.zeros(rows, 1, dtype=torch.bool),
            }
        )
        carry = {key: torch.where(done[:, t].unsqueeze(-1), 0.0, td["next", key]) for key in keys}
        steps.append(td.exclude("actor_x", "critic_x", "state_value"))
    return torch.stack(steps, 1)


# ----------------------------------------------------------------------------- reference
def raw(module) -> nn.RNNBase:
    return module.lstm if isinstance(module, LSTMModule) else module.gru


def stored_state(batch, module, row: int, t: int, nested: bool = False):
    """The state ``module`` stored at (row, t) as ``nn.LSTM`` / ``nn.GRU`` take it."""
    keys = module.in_keys[1:-1]
    states = [batch["next", k] if nested else batch[k] for k in keys]
    states = [s[row, t].reshape(1, 1, HIDDEN) for s in states]
    return tuple(states) if len(states) == 2 else states[0]


def stepwise(network, module, batch, restart) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent module's features at ``s_t`` and ``s'_t``, ``[B, T, HIDDEN]``, by hand:
    the raw cell steps through each row, starting from the stored state where ``restart`` is
    set (detached: it is data). ``s'_t``'s features continue from the state after ``s_t``."""
    cell = raw(module)
    rows, time = batch.shape
    now, following = [], []
    for row in range(rows):
        state = None
        row_now, row_next = [], []
        for t in range(time):
            if restart[row, t]:
                state = stored_state(batch, module, row, t)
            out, state = cell(batch["observation"][row, t].view(1, 1, OBS), state)
            row_now.append(out.view(HIDDEN))
            after, _ = cell(batch["next", "observation"][row, t].view(1, 1, OBS), state)
            row_next.append(after.view(HIDDEN))
        now.append(torch.stack(row_now))
        following.append(torch.stack(row_next))
    return torch.stack(now), torch.stack(following)


def reference_values(critic, batch, restart):
    module, head = critic[0], critic[1].module
    now, following = stepwise(critic, module, batch, restart)
    return head(now), head(following)


def reference_logits(actor, batch, restart):
    module, head = actor.module[0][0], actor.module[0][1].module
    now, _ = stepwise(actor, module, batch, restart)
    return head(now)


def reference_gae(batch, value, next_value):
    rows = []
    for row in range(batch.shape[0]):
        rows.append(
            ref.gae(
                batch["next", "reward"][row].view(-1).tolist(),
                value[row].view(-1).tolist(),
                next_value[row].view(-1).tolist(),
                batch["next", "done"][row].view(-1).tolist(),
                batch["next", "terminated"][row].view(-1).tolist(),
                GAMMA,
                LMBDA,
            )
        )
    return torch.tensor(rows).unsqueeze(-1)


STARTS = [[0, 4], [0, 2, 7], [0]]  # episodes ending mid-row: truncated and terminated
TIME = 10


@pytest.fixture(params=["lstm", "gru"])
def cell(request) -> str:
    return request.param


# ----------------------------------------------------------------------------- chunker
def reference_chunks(batch: TensorDict, seq_len: int) -> TensorDict:
    """The chunks by hand: row by row, chunk by chunk, step by step."""
    rows = batch.reshape(-1, batch.shape[-1])
    time = rows.shape[1]
    num_chunks = -(-time // seq_len)
    out = []
    for row in range(rows.shape[0]):
        for chunk in range(num_chunks):
            steps = []
            for j in range(seq_len):
                t = chunk * seq_len + j
                if t < time:
                    step = rows[row, t].clone()
                    valid = bool(step.get(MASK, torch.tensor(True)))
                else:
                    step = rows[row, 0].clone().zero_()
                    valid = False
                step.set(MASK, torch.tensor(valid))
                steps.append(step)
            out.append(torch.stack(steps))
    return torch.stack(out)


@pytest.mark.parametrize("seq_len", [1, 3, 4, 7, 11])
@pytest.mark.parametrize("batch_shape", [(2,), (2, 3)])
def test_chunk_sequences_matches_reference(seq_len, batch_shape):
    shape = (*batch_shape, 7)
    batch = TensorDict(
        {
            "observation": torch.randn(*shape, OBS),
            "is_init": torch.rand(*shape, 1) < 0.3,
            "h": torch.randn(*shape, 1, HIDDEN),
            "next": {"observation": torch.randn(*shape, OBS), "h": torch.randn(*shape, 1, 4)},
        },
        shape,
    )
    chunks = rlloss.chunk_sequences(batch, seq_len, state_keys=["h"])
    expected = reference_chunks(batch, seq_len)
    assert chunks.batch_size == expected.batch_size
    assert set(chunks.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        torch.testing.assert_close(chunks[key], expected[key], rtol=0, atol=0, msg=str(key))
    # the state at each chunk start is the one stored at that step
    time = shape[-1]
    starts = batch["h"].reshape(-1, time, 1, HIDDEN)[:, ::seq_len].reshape(-1, 1, HIDDEN)
    torch.testing.assert_close(chunks["h"][:, 0], starts, rtol=0, atol=0)


def test_chunk_sequences_keeps_an_existing_mask():
    batch = TensorDict(
        {"x": torch.randn(2, 5), "is_init": torch.zeros(2, 5, 1, dtype=torch.bool)}, [2, 5]
    )
    batch[MASK] = torch.tensor([[True] * 5, [True, True, True, False, False]])
    chunks = rlloss.chunk_sequences(batch, 3, state_keys=[])
    expected = reference_chunks(batch, 3)
    assert chunks[MASK].tolist() == expected[MASK].tolist()
    assert chunks[MASK].tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]]


@pytest.mark.parametrize("seq_len", [0, -2, 2.5, True, None])
def test_chunk_sequences_refuses_bad_seq_len(seq_len):
    batch = TensorDict({"is_init": torch.zeros(2, 5, 1, dtype=torch.bool)}, [2, 5])
    with pytest.raises(ValueError, match="seq_len must be an integer >= 1"):
        rlloss.chunk_sequences(batch, seq_len, state_keys=[])


def test_chunk_sequences_names_missing_entries():
    batch = TensorDict({"h": torch.zeros(2, 5, 1, 4)}, [2, 5])
    with pytest.raises(KeyError, match="no entry 'is_init'.*Entries present: \\['h'\\]"):
        rlloss.chunk_sequences(batch, 2, state_keys=["h"])
    batch["is_init"] = torch.zeros(2, 5, 1, dtype=torch.bool)
    with pytest.raises(KeyError, match="no entry 'c'"):
        rlloss.chunk_sequences(batch, 2, state_keys=["h", "c"])
    with pytest.raises(ValueError, match="needs a time dimension"):
        rlloss.chunk_sequences(batch[0, 0], 2, state_keys=[])


def test_recurrent_state_keys_of_lstm_and_gru_networks():
    assert rlloss.recurrent_state_keys(recurrent_actor("lstm"), recurrent_critic("gru")) == [
        "actor_h",
        "actor_c",
        "critic_h",
    ]
    assert rlloss.recurrent_state_keys(nn.Linear(2, 2)) == []


# ----------------------------------------------------------------------------- networks path
def test_recurrent_modules_take_the_actors_own_call(cell):
    """The planner does not know LSTMModule / GRUModule: the actor runs through its own
    get_dist / get_dist_params and the critic through its own call, on a shallow copy of the
    batch (the caller's batch, "next" included, is never written to)."""
    actor, critic = recurrent_actor(cell), recurrent_critic(cell)
    assert not DistributionCall(actor).direct and DistributionCall(actor).splittable
    assert NetworkCall(critic).steps is None
    batch = collect(actor, critic, cell, STARTS, TIME)
    before = batch.clone()
    with set_recurrent_mode(True):
        logits = DistributionCall(actor)(batch).logits
        params = DistributionCall(actor).distribution_parameters(batch)
        value = NetworkCall(critic)(batch)["state_value"]
    restart = batch["is_init"].squeeze(-1)
    torch.testing.assert_close(logits, reference_logits(actor, batch, restart).log_softmax(-1))
    torch.testing.assert_close(params["logits"], reference_logits(actor, batch, restart))
    torch.testing.assert_close(value, reference_values(critic, batch, restart)[0])
    assert (batch == before).all() and set(batch.keys(True)) == set(before.keys(True))


# ----------------------------------------------------------------------------- GAE
@pytest.mark.parametrize("recurrent", [True, False])
@pytest.mark.parametrize("estimator", ["GAE", "TD0Estimator", "TDLambdaEstimator"])
def test_estimators_on_a_recurrent_critic_match_the_stepwise_reference(cell, recurrent, estimator):
    """Recurrent mode (the critic over the sequences, restarting at is_init) and sequential mode
    (each step from its stored state) give the values of the step-by-step reference, at s and s'
    (across truncations, where V(s') counts), so the estimators' targets are the reference's."""
    actor, critic = recurrent_actor(cell), recurrent_critic(cell)
    batch = collect(actor, critic, cell, STARTS, TIME)
    restart = batch["is_init"].squeeze(-1)
    with torch.no_grad():
        value, next_value = reference_values(critic, batch, restart)
    kwargs = {"lmbda": LMBDA} if estimator != "TD0Estimator" else {}
    module = getattr(rlloss, estimator)(gamma=GAMMA, value_network=critic, **kwargs)
    with torch.no_grad(), set_recurrent_mode(recurrent):
        out = module(batch.clone())
    torch.testing.assert_close(out["state_value"], value)
    torch.testing.assert_close(out["next", "state_value"], next_value)
    if estimator == "GAE":
        torch.testing.assert_close(out["advantage"], reference_gae(batch, value, next_value))
    terminated = batch["next", "terminated"].float()
    td0 = batch["next", "reward"] + GAMMA * (1 - terminated) * next_value
    if estimator == "TD0Estimator":
        torch.testing.assert_close(out["value_target"], td0)


# ----------------------------------------------------------------------------- losses
def clip_ppo_reference(actor, critic, batch, restart, epsilon=0.2):
    """ClipPPOLoss's objective, critic loss (l2) and entropy over the valid steps, by hand."""
    log_probs = reference_logits(actor, batch, restart).log_softmax(-1)
    value, _ = reference_values(critic, batch, restart)
    action = batch["action"]
    new = log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    log_ratio = new - batch["action_log_prob"]
    advantage = batch["advantage"].squeeze(-1)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    objective = -torch.min(ratio * advantage, clipped * advantage)
    critic_loss = (value - batch["value_target"]).pow(2).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    valid = batch.get(MASK, torch.ones_like(advantage, dtype=torch.bool))
    return {
        "loss_objective": objective[valid].mean(),
        "loss_critic": critic_loss[valid].mean(),
        "entropy": entropy[valid].mean(),
    }


def with_gae(actor, critic, cell):
    batch = collect(actor, critic, cell, STARTS, TIME)
    with torch.no_grad(), set_recurrent_mode(True):
        rlloss.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)(batch)
    return batch


def clip_ppo(actor, critic, **kwargs):
    return rlloss.ClipPPOLoss(
        actor, critic, loss_critic_type="l2", entropy_coeff=0.0, critic_coeff=1.0, **kwargs
    )


def test_clip_ppo_on_sequences_matches_the_stepwise_reference(cell):
    actor, critic = recurrent_actor(cell), recurrent_critic(cell)
    batch = with_gae(actor, critic, cell)
    lengths = torch.tensor([[10], [6], [8]])  # trailing padding, as chunks and splits have
    batch[MASK] = torch.arange(TIME) < lengths
    with set_recurrent_mode(True):
        out = clip_ppo(actor, critic)(batch)
    expected = clip_ppo_reference(actor, critic, batch, batch["is_init"].squeeze(-1))
    for key, value in expected.items():
        torch.testing.assert_close(out[key], value, msg=key)


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("PPOLoss", {}),
        ("ClipPPOLoss", {"dual_clip": 3.0}),
        ("KLPENPPOLoss", {"dtarg": 0.01, "adaptive_beta": False}),
        ("RPOLoss", {"rpo_alpha": 0.0}),
    ],
)
def test_ppo_family_on_sequences_equals_the_stepwise_evaluation(cell, name, kwargs):
    """Every PPO-family loss over [B, T] sequences in recurrent mode gives the numbers of the same
    loss evaluated step by step from the stored states (sequential mode, which the flat-batch
    tests check against references): the states the collector stored are the ones the sequences
    reproduce. RPOLoss takes a Gaussian policy (it perturbs a location)."""
    kind = "normal" if name == "RPOLoss" else "categorical"
    actor, critic = recurrent_actor(cell, kind), recurrent_critic(cell)
    batch = with_gae(actor, critic, cell)
    batch[MASK] = torch.ones(batch.shape, dtype=torch.bool)
    batch[MASK][0, -3:] = False
    loss = getattr(rlloss, name)(actor, critic, normalize_advantage=True, **kwargs)
    with set_recurrent_mode(True):
        recurrent = loss(batch)
    stepwise_out = loss(batch)  # sequential mode: each step from its stored state
    assert recurrent.keys() == stepwise_out.keys()
    for key in recurrent.keys():
        torch.testing.assert_close(recurrent[key], stepwise_out[key], msg=key)


def test_rpo_perturbs_a_recurrent_gaussian_policy(cell):
    """RPOLoss with a recurrent actor (parameters through the actor's get_dist_params): with
    alpha 0 it is ClipPPOLoss; with alpha > 0 the noise reaches the new policy (its
    objective and entropy change, the old log-prob does not)."""
    actor, critic = recurrent_actor(cell, "normal"), recurrent_critic(cell)
    batch = with_gae(actor, critic, cell)
    with set_recurrent_mode(True):
        clip = rlloss.ClipPPOLoss(actor, critic)(batch)
        still = rlloss.RPOLoss(actor, critic, rpo_alpha=0.0)(batch)
        torch.manual_seed(0)
        noisy = rlloss.RPOLoss(actor, critic, rpo_alpha=0.5)(batch)
    for key in clip.keys():
        torch.testing.assert_close(still[key], clip[key], msg=key)
    assert not torch.allclose(noisy["loss_objective"], clip["loss_objective"])
    torch.testing.assert_close(noisy["loss_critic"], clip["loss_critic"])


# ----------------------------------------------------------------------------- chunked update
@pytest.mark.parametrize("seq_len", [3, 4, 10, 16])
def test_chunked_update_equals_truncated_bptt_on_the_trajectories(cell, seq_len):
    """GAE on the whole trajectories, then chunks: the chunked ClipPPO update's losses are those
    of the unchunked trajectories (the chunks start from the exact stored states), and its
    gradients those of the step-by-step reference that restarts from the stored (detached) state
    at each chunk start and at is_init: backpropagation through time truncated at the cuts.
    With one chunk per trajectory (seq_len >= T) the gradients are the unchunked ones."""
    actor, critic = recurrent_actor(cell), recurrent_critic(cell)
    batch = with_gae(actor, critic, cell)
    chunks = rlloss.chunk_sequences(batch, seq_len, state_keys=state_keys(cell))
    loss = clip_ppo(actor, critic, normalize_advantage=False)
    with set_recurrent_mode(True):
        whole = loss(batch)
        out = loss(chunks)
    for key in ("loss_objective", "loss_critic", "entropy", "kl_approx", "clip_fraction"):
        torch.testing.assert_close(out[key], whole[key], msg=key)
    assert (chunks[MASK].sum() == batch.numel()).item()

    params = list(loss.parameters())
    grads = torch.autograd.grad(out["loss_objective"] + out["loss_critic"], params)
    restart = batch["is_init"].squeeze(-1) | (torch.arange(TIME) % seq_len == 0)
    expected = clip_ppo_reference(actor, critic, batch, restart)
    expected_grads = torch.autograd.grad(
        expected["loss_objective"] + expected["loss_critic"], params
    )
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)
    if seq_len >= TIME:
        with set_recurrent_mode(True):
            full = loss(batch)
        full_grads = torch.autograd.grad(full["loss_objective"] + full["loss_critic"], params)
        for grad, full_grad in zip(grads, full_grads, strict=True):
            torch.testing.assert_close(grad, full_grad)


def test_chunked_gae_needs_the_whole_trajectories(cell):
    """GAE computed on the chunks (each cut bootstraps from V(s')) differs from GAE on the
    trajectories, which the chunks carry: the reason to estimate before chunking."""
    actor, critic = recurrent_actor(cell), recurrent_critic(cell)
    batch = with_gae(actor, critic, cell)
    chunks = rlloss.chunk_sequences(batch, 4, state_keys=state_keys(cell))
    on_chunks = chunks.exclude("advantage", "value_target")
    with torch.no_grad(), set_recurrent_mode(True):
        rlloss.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)(on_chunks)
    valid = chunks[MASK]
    torch.testing.assert_close(on_chunks["state_value"][valid], chunks["state_value"][valid])
    assert not torch.allclose(on_chunks["advantage"][valid], chunks["advantage"][valid])


# ----------------------------------------------------------------------------- boundaries
def test_gradients_never_cross_an_episode_boundary(cell):
    """One row holding two episodes (is_init at step 2): the gradient of episode 2's loss terms
    with respect to episode 1's observations is exactly zero; without the marker it is not."""
    actor, critic = recurrent_actor(cell), recurrent_critic(cell)
    batch = with_gae(actor, critic, cell)[1:2]  # row 1: episodes at 0, 2 and 7
    boundary = 2
    batch = batch[:, :7]  # two episodes: steps 0-1 and 2-6
    loss = clip_ppo(actor, critic, reduction="none")

    def episode_two_gradient(batch):
        observation = batch["observation"].clone().requires_grad_(True)
        batch = batch.clone().set("observation", observation)
        with set_recurrent_mode(True):
            out = loss(batch)
        terms = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        (grad,) = torch.autograd.grad(terms[:, boundary:].sum(), observation)
        return grad

    grad = episode_two_gradient(batch)
    assert (grad[:, :boundary] == 0).all()
    assert (grad[:, boundary:].abs().sum(-1) > 0).all()
    leaking = batch.clone()
    leaking["is_init"][:, boundary] = False
    assert (episode_two_gradient(leaking)[:, :boundary].abs().sum(-1) > 0).all()


def test_loss_error_names_a_missing_recurrent_state(cell):
    actor, critic = recurrent_actor(cell), recurrent_critic(cell)
    batch = with_gae(actor, critic, cell).exclude("is_init")
    with pytest.raises(KeyError, match="is_init"), set_recurrent_mode(True):
        clip_ppo(actor, critic)(batch)
