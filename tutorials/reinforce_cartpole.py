"""REINFORCE with a learned baseline on CartPole-v1 with rlloss, in a single file.

This tutorial trains an agent with rlloss's ``ReinforceLoss`` and ``TD1Estimator`` (drop-in
replacements for ``torchrl.objectives``) around a collector you write yourself. The pieces map
to the episodic REINFORCE of Williams, "Simple statistical gradient-following algorithms for
connectionist reinforcement learning" (Machine Learning 8, 1992), with a learned reinforcement
baseline b(s) = V(s) as in Sutton & Barto, "Reinforcement Learning: An Introduction" (2nd ed.,
section 13.4, "REINFORCE with Baseline"):

1. play whole episodes with a ~ pi(a|s): NUM_ENVS envs step until each has finished at least
   one episode; the batch keeps each env's steps up to its last episode end, and the envs are
   reset, dropping the episodes still unfinished. Every episode in a batch is played from its
   start to its end by the policy being updated;
2. the Monte-Carlo return of every step, G_t = r_t + gamma r_{t+1} + ... to the end of its
   episode (``TD1Estimator``: the lambda = 1 return), and the advantage A_t = G_t - V(s_t);
3. one gradient step on ``ReinforceLoss``: -log pi(a_t|s_t) A_t (``loss_actor``) plus the
   baseline's regression (G_t - V(s_t))^2 (``loss_value``).

Two choices beyond the paper: an episode cut at CartPole's 500-step time limit did not
terminate, so its last return is bootstrapped, r + gamma V(s'), as everywhere in these
tutorials (all other returns are pure Monte-Carlo ones); and the advantages are normalised over
the batch, which keeps the step size steady while the returns grow from about 20 to 100. Sutton
& Barto's gamma^t factor on the update is left out, as in most implementations. The networks
(separate 64-64 tanh MLPs) and gamma = 0.99 are those of ``a2c_cartpole.py``. Adam's lr, 1e-3,
is annealed linearly to 0 over the budget, as in ``ppo_cartpole.py``: at a constant lr the
returns still dip late in training (see the results). After training, the most probable action
(no sampling) plays 10 evaluation episodes from start states no training episode had.

Budget: 500,000 environment steps, the A2C budget of rl-baselines3-zoo (there is no published
REINFORCE result to match), so that the two tutorials compare at equal cost. REINFORCE needs
them: it makes one update per batch of whole episodes (about 8 x 500 = 4,000 steps once the
pole stays up), the steps of the dropped unfinished episodes count too (a fifth of them), and
even at 500k the training return (sampled actions) has not reached the target: its mean over
the last 50k steps is 388, 460 and 417 on seeds 0, 1, 2 (57 to 65 over the first 50k, 346 to
404 around 250k); only the deterministic policy scores 500. No smaller budget was tried.

Results (500,000 steps, one CPU thread, ``benchmarks/learning.py --tasks reinforce_cartpole``,
seeds 0, 1, 2): final_return (deterministic
evaluation) 500, 500 and 500; the last 10 training episodes (sampled actions) 430.1, 455.1 and
457.8; wall_time 241, 232 and 176 s. With TorchRL's ``ReinforceLoss`` and ``TD1Estimator``
swapped in: final_return 500, 500 and 500; training 406.0, 481.4 and 441.0; wall_time 236, 80
and 95 s. On seed 0 the two libraries give the same first 902 episodes. A first version with a
constant lr of 1e-3 ended at final_return 500, 472.6 and 500 (rlloss), seed 1 after training
returns of about 480.

Run:
    python tutorials/reinforce_cartpole.py --seed 0 --total-frames 500000 --out runs/reinforce

It writes ``OUT/returns.csv`` (one row per finished episode) and ``OUT/curve.png``; it prints
``train_return=`` (mean of the last 10 training episodes), ``eval_return=`` and last
``final_return=`` (both the mean return of the deterministic evaluation).
"""

import _helpers as helpers  # tutorials/_helpers.py
import torch
from tqdm import tqdm

from rlloss import ReinforceLoss, TD1Estimator

parser = helpers.tutorial_parser(__doc__, "runs/reinforce_cartpole", 500_000, "env steps")
helpers.evaluation_flags(parser)  # --eval-episodes
args = parser.parse_args()

# Hyperparameters.
NUM_ENVS = 8  # a batch holds at least one whole episode of each
GAMMA = 0.99
LR = 1e-3  # linearly annealed to 0

device, start_time = helpers.start(args)  # seeds network init and action sampling

# Environment: NUM_ENVS CartPoles stepped together.
envs, obs_dim, num_actions = helpers.discrete_vec("CartPole-v1", NUM_ENVS)

# Policy pi(a|s) (writes "logits", samples "action") and the baseline V(s) ("state_value"):
# separate 64-64 tanh MLPs (_helpers.categorical_actor_critic).
actor, critic = helpers.categorical_actor_critic(obs_dim, num_actions, device)

return_module = TD1Estimator(gamma=GAMMA, value_network=critic)
loss_module = ReinforceLoss(actor_network=actor, critic_network=critic,
                            loss_critic_type="l2").to(device)  # the squared error (G - V(s))^2
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

collector = helpers.VectorCollector(envs, device, seed=args.seed)
episodes = collector.episodes  # (frames, episode_return) for every finished episode
policy = helpers.sample_from(actor)  # a ~ pi(.|s)
pbar = tqdm(total=args.total_frames, unit="frames")

while collector.frames < args.total_frames:
    optimizer.param_groups[0]["lr"] = LR * (1.0 - collector.frames / args.total_frames)

    # ---- Play until every env has finished an episode, all with the current policy ----
    steps, finished = [], torch.zeros(NUM_ENVS, dtype=torch.bool, device=device)
    while not finished.all():
        steps.append(collector.step(policy))
        finished |= steps[-1]["next", "done"].squeeze(-1)
    rollout = torch.stack(steps, dim=1)  # batch size [NUM_ENVS, steps]
    # Keep the whole episodes: each env's steps up to its last episode end.
    done = rollout["next", "done"].squeeze(-1)
    batch = rollout[done.flip(1).cumsum(1).flip(1) > 0]  # [steps kept], env after env
    collector.reset()  # drop the unfinished episodes: the next batch starts new ones

    # ---- Monte-Carlo returns G_t and advantages A = G_t - V(s_t) ----
    with torch.no_grad():
        return_module(batch)  # writes "advantage" and "value_target" (= G)
    advantage = batch["advantage"]
    batch["advantage"] = (advantage - advantage.mean()) / (advantage.std() + 1e-8)

    # ---- One gradient step on the policy gradient and the baseline's regression ----
    losses = loss_module(batch)
    loss = losses["loss_actor"] + losses["loss_value"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    helpers.show_progress(pbar, episodes, collector.frames)
pbar.close()
envs.close()

# ---- Save the learning curve, evaluate the final policy without sampling (argmax_a pi(a|s)) on
# start states training never scored, and report ----
helpers.finish(args, start_time, episodes, "REINFORCE on CartPole-v1", env_id="CartPole-v1",
               policy=helpers.most_probable_action(actor, device))
