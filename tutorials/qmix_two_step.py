"""QMIX and VDN on the QMIX paper's two-step cooperative game, with rlloss's QMixerLoss.

Rashid et al., "QMIX: Monotonic Value Function Factorisation for Deep Multi-Agent Reinforcement
Learning", arXiv:1803.11485, section 6.1: two agents, two steps, one team reward. In the first
state both agents act, and agent 1's action alone picks the second state: 2A (action 0) pays 7
whatever the agents do; 2B (action 1) pays by the joint action,

    agent 1 \\ agent 2    0    1
           0              0    1
           1              1    8

The best joint policy (2B, then both play 1) earns 8. Each agent picks its action from its own
Q-values (decentralised execution); the team's value ``Q_tot`` is a mix of the agents' chosen
Q-values, trained by TD on the team reward (``QMixerLoss``, a drop-in for TorchRL's):

- ``--mixer vdn``: ``Q_tot = sum_i Q_i`` (Sunehag et al., arXiv:1706.05296). A sum cannot
  represent 2B's payoffs, so its greedy policy settles for 2A's 7 (the paper's Table 1);
- ``--mixer qmix``: a monotonic mixing network conditioned on the state (TorchRL's ``QMixer``):
  it represents 2B well enough for the greedy agents to find the 8.

Data: episodes played with uniformly random actions (the paper's full exploration) into a TorchRL
replay buffer; the loss samples minibatches of transitions from it. After every
``--eval-every`` updates the agents' greedy policy plays one episode: its return is the curve.

Run:
    python tutorials/qmix_two_step.py --seed 0 --mixer qmix --out runs/qmix_two_step

Results (2,000 updates, the greedy policy's return; seeds 0, 1, 2), with rlloss and with the
same script importing TorchRL's ``QMixerLoss`` and ``SoftUpdate`` instead (the one-import swap of
``tools/tutorial_runs.py``): QMIX 8.0, 8.0, 8.0 with both libraries; VDN 7.0, 7.0, 7.0 with
both. QMIX reaches 8 after 500 updates on seed 0. This is the paper's outcome (QMIX finds the
optimal joint policy, VDN does not).

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --mixer qmix --total-frames 2000: final_return = 8.0 8.0 8.0
    [figures] rlloss, seeds 0 1 2, --mixer vdn --total-frames 2000: final_return = 7.0 7.0 7.0
    [figures] torchrl, seeds 0 1 2, --mixer qmix --total-frames 2000: final_return = 8.0 8.0 8.0
    [figures] torchrl, seeds 0 1 2, --mixer vdn --total-frames 2000: final_return = 7.0 7.0 7.0

It writes ``OUT/returns.csv`` (per evaluation: updates, greedy return) and ``OUT/curve.png``; the
last printed line is ``final_return=<the greedy policy's return after training>``. A few seconds
on one CPU thread.
"""

import _helpers as helpers  # tutorials/_helpers.py
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Categorical, LazyTensorStorage, ReplayBuffer
from torchrl.modules import QValueModule, SafeSequential
from torchrl.modules.models.multiagent import QMixer, VDNMixer

from rlloss import QMixerLoss, SoftUpdate

parser = helpers.tutorial_parser(__doc__, "runs/qmix_two_step", 2000, "gradient updates")
parser.add_argument("--mixer", choices=("qmix", "vdn"), default="qmix")
parser.add_argument("--eval-every", type=int, default=100)
args = parser.parse_args()

N_AGENTS, N_ACTIONS, N_STATES = 2, 2, 3  # states: 0 the first, 1 = 2A, 2 = 2B
EPISODES, BATCH_SIZE = 2_000, 128  # random episodes in the replay buffer; transitions per update
GAMMA, LR, TAU = 0.99, 5e-4, 0.05
PAYOFF_2B = torch.tensor([[0.0, 1.0], [1.0, 8.0]])

device, start_time = helpers.start(args)


# ---- The game, batched: functions of the state index and the joint action ----
def observe(state: torch.Tensor) -> dict:
    """The global state (one-hot) and each agent's observation: the state and its own id."""
    one_hot = nn.functional.one_hot(state, N_STATES).float()
    agent_id = torch.eye(N_AGENTS).expand(len(state), N_AGENTS, N_AGENTS)
    observation = torch.cat([one_hot.unsqueeze(1).expand(-1, N_AGENTS, -1), agent_id], -1)
    agents = TensorDict({"observation": observation}, [len(state), N_AGENTS])
    return {"state": one_hot, "agents": agents}


def step(state: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The next state and the team reward for joint actions ``[B, N_AGENTS]``."""
    first = state == 0
    next_state = torch.where(first, 1 + action[:, 0], state)  # agent 1 picks 2A or 2B
    reward = torch.where(state == 1, 7.0, PAYOFF_2B[action[:, 0], action[:, 1]])
    return next_state, torch.where(first, 0.0, reward)


def transitions(state: torch.Tensor, action: torch.Tensor) -> TensorDict:
    next_state, reward = step(state, action)
    terminated = (state != 0).unsqueeze(-1)  # the second step ends the episode
    data = TensorDict(observe(state), [len(state)])
    data["agents", "action"] = action
    data["next"] = TensorDict(
        {**observe(next_state), "reward": reward.unsqueeze(-1), "terminated": terminated,
         "done": terminated},
        [len(state)],
    )
    return data


# ---- The agents: one Q network shared by both (each reads its id), greedy heads ----
q_net = TensorDictModule(
    nn.Sequential(nn.Linear(N_STATES + N_AGENTS, 64), nn.ReLU(), nn.Linear(64, N_ACTIONS)),
    in_keys=[("agents", "observation")],
    out_keys=[("agents", "action_value")],
)
local_q = SafeSequential(q_net, QValueModule(
    action_value_key=("agents", "action_value"),
    out_keys=[("agents", "action"), ("agents", "action_value"), ("agents", "chosen_action_value")],
    spec=Categorical(N_ACTIONS),
))
if args.mixer == "qmix":  # Q_tot = f_state(Q_1, Q_2), monotonic in each Q_i
    mixer = TensorDictModule(
        QMixer(state_shape=(N_STATES,), mixing_embed_dim=16, n_agents=N_AGENTS, device=device),
        in_keys=[("agents", "chosen_action_value"), "state"],
        out_keys=["chosen_action_value"],
    )
else:  # Q_tot = Q_1 + Q_2
    mixer = TensorDictModule(VDNMixer(n_agents=N_AGENTS, device=device),
                             in_keys=[("agents", "chosen_action_value")],
                             out_keys=["chosen_action_value"])

loss_module = QMixerLoss(local_q, mixer, delay_value=True)  # target networks for the TD target
loss_module.make_value_estimator(gamma=GAMMA)
updater = SoftUpdate(loss_module, tau=TAU)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

# ---- Random play: both steps of EPISODES episodes, uniformly random joint actions ----
first = torch.zeros(EPISODES, dtype=torch.long)
first_actions = torch.randint(N_ACTIONS, (EPISODES, N_AGENTS))
second = step(first, first_actions)[0]
buffer = ReplayBuffer(storage=LazyTensorStorage(2 * EPISODES), batch_size=BATCH_SIZE)
buffer.extend(transitions(first, first_actions))
buffer.extend(transitions(second, torch.randint(N_ACTIONS, (EPISODES, N_AGENTS))))


def greedy_return() -> float:
    """One episode of the agents' greedy policy: the team reward it earns."""
    state, total = torch.zeros(1, dtype=torch.long), 0.0
    with torch.no_grad():
        for _ in range(2):
            action = local_q(TensorDict(observe(state), [1]))["agents", "action"]
            state, reward = step(state, action)
            total += reward.item()
    return total


curve = []  # (updates, greedy return)
for update in range(1, args.total_frames + 1):
    losses = loss_module(buffer.sample())
    optimizer.zero_grad()
    losses["loss"].backward()
    optimizer.step()
    updater.step()
    if update % args.eval_every == 0:
        curve.append((update, greedy_return()))
print(f"greedy first-step joint action: "
      f"{local_q(TensorDict(observe(torch.zeros(1, dtype=torch.long)), [1]))['agents', 'action']}")
helpers.finish(args, start_time, curve, f"QMixerLoss ({args.mixer}) on the two-step game")
