"""PPO on CartPole-v1 with rlloss, in a single file.

This tutorial shows how to train an agent with rlloss's ``ClipPPOLoss`` and ``GAE`` (drop-in
replacements for ``torchrl.objectives``) around a plain gymnasium collector (``VectorCollector``, a short class of
``tutorials/_helpers.py``):

1. a gymnasium vector env is stepped by a TorchRL ``ProbabilisticActor``; each rollout is stored
   as a TensorDict of batch size ``[num_envs, num_steps]`` (time is the last batch dim);
2. ``GAE`` computes advantages and value targets for the whole rollout (PPO paper, eq. 11);
3. ``ClipPPOLoss`` gives the clipped surrogate objective (eq. 7) plus the value loss (eq. 9),
   optimised for a few epochs over the same rollout.

Hyperparameters are the rl-baselines3-zoo ones tuned for CartPole. The agent reaches the maximal
return of 500 in about 100k environment steps, a minute or two on a laptop CPU.

Run:
    python tutorials/ppo_cartpole.py --seed 0 --total-frames 100000 --out runs/ppo_cartpole

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; the last
printed line is ``final_return=<mean return of the last 10 episodes>``.
"""

import _helpers as helpers  # tutorials/_helpers.py
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator

from rlloss import GAE, ClipPPOLoss

parser = helpers.tutorial_parser(__doc__, "runs/ppo_cartpole", 100_000, "env steps, all envs")
args = parser.parse_args()

# Hyperparameters (rl-baselines3-zoo, ppo.yml, CartPole-v1).
NUM_ENVS = 8
NUM_STEPS = 32  # steps per env per rollout: a rollout holds 8 * 32 = 256 transitions
NUM_EPOCHS = 20  # optimisation passes over each rollout
MINIBATCH_SIZE = 256  # the whole rollout
GAMMA, LMBDA = 0.98, 0.8
LR = 1e-3  # linearly annealed to 0
CLIP_EPSILON = 0.2  # linearly annealed to 0
ENTROPY_COEFF, CRITIC_COEFF = 0.0, 0.5
MAX_GRAD_NORM = 0.5

device, start_time = helpers.start(args)  # seeds network init and action sampling

# Environment: NUM_ENVS CartPoles stepped together. SAME_STEP autoreset: when an episode ends,
# step() returns the first observation of the next one (see _helpers.make_vec).
envs, obs_dim, num_actions = helpers.discrete_vec("CartPole-v1", NUM_ENVS)

# Policy pi(a|s): an MLP writes "logits"; ProbabilisticActor samples "action" from
# Categorical(logits) and records its log-probability (the "old" log-prob of the PPO ratio).
policy_net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[64, 64],
                 activation_class=nn.Tanh)
actor = ProbabilisticActor(
    TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
    in_keys=["logits"],
    distribution_class=torch.distributions.Categorical,
    return_log_prob=True,
).to(device)
# Value function V(s), written to "state_value".
critic = ValueOperator(
    MLP(in_features=obs_dim, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh),
    in_keys=["observation"],
).to(device)

advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
loss_module = ClipPPOLoss(
    actor_network=actor,
    critic_network=critic,
    clip_epsilon=CLIP_EPSILON,
    entropy_coeff=ENTROPY_COEFF,
    critic_coeff=CRITIC_COEFF,
    loss_critic_type="l2",
    normalize_advantage=True,
).to(device)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

# env i is seeded with seed + i; a progress bar over num_iterations * NUM_ENVS * NUM_STEPS frames
collector, num_iterations, pbar = helpers.start_collection(envs, device, args.seed, NUM_STEPS,
                                                           args.total_frames)
episodes = collector.episodes  # (frames, episode_return) for every finished episode
policy = helpers.sample_from(actor)  # a ~ pi(.|s); the actor also writes "action_log_prob"

for iteration in range(num_iterations):
    # Anneal the learning rate and the clipping range linearly to 0.
    frac = 1.0 - iteration / num_iterations
    optimizer.param_groups[0]["lr"] = LR * frac
    loss_module.clip_epsilon.copy_(CLIP_EPSILON * frac)

    # ---- Collect a rollout with the current policy ----
    # Each step: observation, action, its log-probability and ("next", ...): the true successor
    # state, reward, terminated (no bootstrapping from V(s')) and done (terminated or truncated
    # at the 500-step time limit: the GAE trace stops there, the next step starts a new episode).
    rollout = torch.stack([collector.step(policy, keep=("action_log_prob",))
                           for _ in range(NUM_STEPS)], dim=1)  # [NUM_ENVS, NUM_STEPS], time last

    # ---- Advantages A_t and value targets, computed once with the pre-update critic ----
    with torch.no_grad():
        advantage_module(rollout)  # writes "advantage" and "value_target"

    # ---- Optimise the PPO objective for NUM_EPOCHS epochs over the rollout: each epoch in
    # random minibatches of MINIBATCH_SIZE transitions, each an Adam step on the sum of the
    # "loss_*" entries (objective, critic, entropy), the gradient norm clipped to MAX_GRAD_NORM
    # (helpers.gradient_epochs) ----
    helpers.gradient_epochs(loss_module, optimizer, rollout.reshape(-1), num_epochs=NUM_EPOCHS,
                            minibatch_size=MINIBATCH_SIZE, max_grad_norm=MAX_GRAD_NORM)

    helpers.show_progress(pbar, episodes, collector.frames)
pbar.close()
envs.close()

# ---- Save the learning curve and report ----
helpers.finish(args, start_time, episodes, "PPO on CartPole-v1")
