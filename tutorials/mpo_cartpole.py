"""Categorical MPO on CartPole-v1 with rlloss, in a single file.

This tutorial trains a categorical policy and a Q-network with rlloss's ``DiscreteMPOLoss``
around a collector you write yourself. With a few discrete actions, MPO's E-step needs no
sampling: every action is scored (Abdolmaleki et al., "Maximum a Posteriori Policy
Optimisation", arXiv:1806.06920; DeepMind Acme's ``CategoricalMPO``):

1. act with a ~ pi(.|s), a TorchRL ``ProbabilisticActor`` over a ``Categorical`` (an MLP writes
   the logits), in 4 environments, and store (s, a, r, s', terminated) in a TorchRL replay
   buffer;
2. after every 64 steps of each environment, take 128 gradient steps, each on the sum of
   ``DiscreteMPOLoss``'s four outputs on a sampled minibatch:

   - E-step: the improved policy q(a|s) ~ pi_target(a|s) exp(Q_target(s, a) / eta);
     ``loss_temperature`` adapts eta so that KL(q || pi_target) stays near epsilon = 0.1;
   - M-step (``loss_actor``): the cross-entropy -sum_a q(a|s) log pi(a|s) plus alpha
     KL(pi_target || pi); ``loss_alpha`` adapts alpha so that this KL stays near 2.5e-3;
   - critic (``loss_qvalue``): (Q(s, a) - y)^2 with the exact expected-SARSA target
     y = r + gamma (1 - terminated) sum_a' pi_target(a'|s') Q_target(s', a');
3. every 100 gradient steps copy the online networks into the targets (TorchRL's
   ``HardUpdate``; Acme's ``target_update_period``).

After training, the greedy policy argmax_a pi(a|s) plays 10 evaluation episodes from start
states no training episode had.

The duals (eta and alpha) are parameters of the loss, in their own Adam parameter group with
Acme's dual learning rate, 1e-2. The MPO hyperparameters are Acme's categorical MPO defaults
(epsilon = 0.1, epsilon_policy = 2.5e-3, initial dual parameters 3, hard target updates every 100
gradient steps). The networks and their optimisation follow the DQN tutorial (rl-zoo's DQN on
CartPole: 256x256 MLPs, batch 64, learning rate 2.3e-3 annealed to 0 as (1 - progress)^2,
gradient norms clipped at 10) instead of Acme's (64x64 here before, batch 256, learning rate
1e-4, clip 40), because the budget is 100,000 steps rather than millions: with a 64x64 network,
batch 256 and a rate of 3e-4 annealed linearly, the seeds ended at 436, 321 and 200 (greedy
evaluation); with a rate of 1e-3 at 500, 146 and 500. Each training phase takes one gradient
step per two environment steps.

Results (100,000 steps, one CPU thread; seeds 0, 1, 2): final_return (greedy evaluation) 500, 500
and 136; the last 10 training episodes 500, 500 and 137; wall 994, 1,092 and 709 s. The target of
475 is met on 2 seeds of 3. Seed 2 climbs to about 400 by 50k steps, oscillates, and collapses
after 88k steps, with a learning rate already below 6% of its start. After the policy is nearly
deterministic the temperature sits at its floor (with two actions KL(q || pi_target) cannot reach
0.1), so the E-step is a greedy improvement on a Q-function that is still unstable, as in DQN;
the KL bound on the M-step slows the policy's moves but does not stop that.

CartPole episodes are truncated after 500 steps; a truncated transition keeps its bootstrap term
(only ``terminated``, the pole falling, stops it).

Run:
    python tutorials/mpo_cartpole.py --seed 0 --total-frames 100000 --out runs/mpo_cartpole

It writes ``OUT/returns.csv`` (one row per finished episode), ``OUT/diagnostics.csv`` (duals and
KLs after each training phase) and ``OUT/curve.png`` (returns, duals, KLs); it prints
``train_return=`` (mean of the last 10 training episodes, actions sampled from the policy),
``eval_return=`` and last ``final_return=`` (both the mean return of the greedy evaluation).
"""

import _helpers as helpers  # tutorials/_helpers.py
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import Categorical
from torchrl.modules import MLP, ProbabilisticActor
from torchrl.objectives import HardUpdate

from rlloss import DiscreteMPOLoss

parser = helpers.tutorial_parser(__doc__, "runs/mpo_cartpole", 100_000, "env steps, all envs")
helpers.evaluation_flags(parser)  # --eval-episodes
args = parser.parse_args()

# Hyperparameters (Acme's categorical MPO, the DQN tutorial's optimisation; see the docstring).
NUM_ENVS = 4
NUM_STEPS = 64  # steps per env between training phases: 4 * 64 = 256 env steps
GRADIENT_STEPS = 128  # gradient steps per training phase (one per two env steps)
LEARNING_STARTS = 1_000  # env steps of uniformly random actions before training
BUFFER_SIZE = 100_000
BATCH_SIZE = 64
GAMMA = 0.99
LR = 2.3e-3  # actor and critic, annealed to 0 as (1 - progress)^2
DUAL_LR = 1e-2  # temperature and alpha
MAX_GRAD_NORM = 10.0
TARGET_UPDATE_PERIOD = 100  # gradient steps between hard target updates

device, start_time = helpers.start(args)  # seeds network init, exploration and replay sampling

# Environment: NUM_ENVS CartPoles stepped together, with SAME_STEP autoreset (_helpers.make_vec).
envs, obs_dim, num_actions = helpers.discrete_vec("CartPole-v1", NUM_ENVS)

# pi(a|s) = Categorical(softmax(logits(s))); the sampled "action" is an index.
policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[256, 256],
                 activation_class=nn.ELU)
actor = ProbabilisticActor(TensorDictModule(policy_net, ["observation"], ["logits"]),
                           in_keys=["logits"], distribution_class=Categorical).to(device)

# Q(s, .): an MLP writing the value of every action, "action_value".
critic = TensorDictModule(
    MLP(in_features=obs_dim, out_features=num_actions, num_cells=[256, 256],
        activation_class=nn.ELU),
    in_keys=["observation"],
    out_keys=["action_value"],
).to(device)

# The loss keeps target copies of both networks.
loss_module = DiscreteMPOLoss(
    actor, critic, epsilon=0.1, epsilon_policy=2.5e-3, init_log_temperature=3.0,
    init_log_alpha=3.0, gamma=GAMMA,
).to(device)
# HardUpdate copies on every (interval + 1)-th step(), hence the - 1.
target_updater = HardUpdate(loss_module, value_network_update_interval=TARGET_UPDATE_PERIOD - 1)
# Adam: the networks at LR, the duals at DUAL_LR. update(batch): one step on the sum of the MPO
# losses, the networks' gradients clipped to MAX_GRAD_NORM, then Acme's floor on the dual
# parameters and the target update; it returns the loss outputs (mpo_pendulum.py's update).
optimizer, update = helpers.mpo_optimisation(loss_module, actor, critic, target_updater, lr=LR,
                                             dual_lr=DUAL_LR, max_grad_norm=MAX_GRAD_NORM)

replay_buffer = helpers.replay_memory(BUFFER_SIZE, BATCH_SIZE, device)  # on the training device

DIAGNOSTICS = ["temperature", "alpha", "kl_q", "kl", "q_mean"]
diagnostics = []  # (frames, *DIAGNOSTICS) after each training phase
# env i is seeded with seed + i; a progress bar over num_iterations * NUM_ENVS * NUM_STEPS frames
collector, num_iterations, pbar = helpers.start_collection(envs, device, args.seed, NUM_STEPS,
                                                           args.total_frames)
episodes = collector.episodes  # (frames, episode_return) for every finished episode
sample = helpers.sample_from(actor)  # a ~ pi(.|s)


def behaviour(td):
    """Uniformly random actions before LEARNING_STARTS, then a ~ pi(.|s)."""
    if collector.frames < LEARNING_STARTS:
        return torch.randint(num_actions, (NUM_ENVS,), device=device)
    return sample(td)


for iteration in range(num_iterations):
    optimizer.param_groups[0]["lr"] = LR * (1.0 - iteration / num_iterations) ** 2

    # ---- Act and store the transitions (observation, action, next: observation, reward,
    # terminated) ----
    steps = [collector.step(behaviour).exclude(("next", "done")) for _ in range(NUM_STEPS)]
    replay_buffer.extend(torch.cat(steps))

    # ---- Learn: gradient steps on the sum of the MPO losses ----
    if collector.frames >= LEARNING_STARTS:
        for _ in range(GRADIENT_STEPS):
            losses = update(replay_buffer.sample())
        diagnostics.append((collector.frames, *(float(losses[k]) for k in DIAGNOSTICS)))

    helpers.show_progress(pbar, episodes, collector.frames)
pbar.close()
envs.close()

# ---- Save the duals and KLs, and a figure of them beside the learning curve ----
helpers.save_dual_diagnostics(args.out, episodes, "Categorical MPO on CartPole-v1", DIAGNOSTICS,
                              diagnostics, duals=("temperature", "alpha"),
                              kl_bounds={"kl_q": 0.1, "kl": 2.5e-3})


# ---- Save the learning curve, evaluate the most probable action argmax_a pi(a|s) (no
# sampling) on start states training never scored, report ----
helpers.finish(args, start_time, episodes, "Categorical MPO on CartPole-v1", env_id="CartPole-v1",
               policy=helpers.most_probable_action(actor, device), plot=False)
