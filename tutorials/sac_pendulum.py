"""Soft actor-critic (SAC) on Pendulum-v1 with rlloss, in a single file.

This tutorial trains a tanh-Gaussian policy and two Q-networks with rlloss's ``SACLoss`` (a
drop-in replacement for ``torchrl.objectives.SACLoss``) around a collector you write yourself.
The pieces map to "Soft Actor-Critic Algorithms and Applications" (Haarnoja et al.,
arXiv:1812.05905, Algorithm 1):

1. act with a ~ pi(.|s), a TorchRL ``ProbabilisticActor`` over a ``TanhNormal`` (the Gaussian's
   sample squashed by tanh onto the action bounds), and store (s, a, r, s', terminated) in a
   replay buffer (TorchRL's);
2. for every environment step, sample a minibatch and take one gradient step on the sum of
   ``SACLoss``'s three outputs:

   - ``loss_qvalue``: sum_i (Q_i(s, a) - y)^2 with the soft target
     y = r + gamma (1 - terminated) (min_i Q_i,target(s', a') - alpha log pi(a'|s')),
     a' ~ pi(.|s') (eqs. 5-6; two Q-networks and the minimum of their targets, as in TD3);
   - ``loss_actor``: alpha log pi(a~|s) - min_i Q_i(s, a~), a~ reparameterised (eq. 7);
   - ``loss_alpha``: -log(alpha) (log pi(a~|s) + target_entropy), target_entropy = -dim(A)
     (eq. 18, automatic temperature).

   Each output only sends gradient to its own parameters (the actor loss does not move the
   critics, the temperature loss only moves log(alpha)), so one optimizer on the sum is the
   same as three optimizers with one learning rate;
3. move the target Q-networks towards the online ones, Q_target <- tau Q + (1 - tau) Q_target,
   with TorchRL's ``SoftUpdate``.

Pendulum episodes never terminate; they are truncated after 200 steps, and a truncated
transition keeps its bootstrap term (only ``terminated`` enters the target).

Hyperparameters are rl-baselines3-zoo's Pendulum SAC (SB3 defaults with learning rate 1e-3):
256x256 MLPs, batch 256, gamma 0.99, tau 0.005, one gradient step per environment step,
alpha learned from 1.0. Two choices of ours: 1,000 steps of uniformly random actions before
learning (SB3 uses 100; five full episodes of random data steady the first critic updates), and
the squared-error critic loss of the paper (``loss_function="l2"``; TorchRL's default is
smooth L1).

``redq_pendulum.py``, ``tqc_pendulum.py`` and ``crossq_pendulum.py`` run the same loop with
their losses. After training, the policy's squashed mean (no sampling) plays 10 evaluation
episodes from start states no training episode had.

Results (20,000 steps, one CPU thread; seeds 0, 1, 2): final_return (evaluation) -108.5, -106.7
and -160.3 (rl-zoo: about -150); the last 10 training episodes -178.8, -190.5 and -196.2; wall
1,213, 824 and 689 s. The last 10 training episodes of a seed start from the same states whatever the
agent (the resets depend on the seed alone), and for these seeds they are harder than average:
the near-optimal hand-written controller of ``compose_losses.py`` (about -150 over random
starts) scores -184, -192 and -222 on them. Re-run with the periodic evaluation
(``benchmarks/learning.py``): final_return -112.3, -106.5 and -158.2; the evaluation first at or
above -200 at 4,000, 5,000 and 5,000 steps (seed 2: -208.5 at 4,000, -162.0 at 5,000); wall 605,
584 and 931 s.

Run:
    python tutorials/sac_pendulum.py --seed 0 --total-frames 20000 --out runs/sac_pendulum

It writes ``OUT/returns.csv`` (one row per finished episode), ``OUT/eval_returns.csv`` (the
mean return of the deterministic policy over the 10 evaluation start states every 1,000 steps,
``--eval-every``; it draws no torch random number, so training is the same with or without it)
and ``OUT/curve.png``; it prints ``first_eval_at_target=`` (the first of those evaluations at or
above -200), ``train_return=`` (mean of the last 10 training episodes, actions sampled from the
policy), ``eval_return=`` and last ``final_return=`` (both the mean return of the evaluation
episodes).
"""

import _helpers as helpers  # tutorials/_helpers.py: the plumbing
import torch
from torchrl.objectives import SoftUpdate, ValueEstimators

from rlloss import SACLoss

# --seed, --total-frames, --device, --out, --eval-every, --eval-episodes, --save-actor
args = helpers.soft_actor_critic_parser(__doc__, "runs/sac_pendulum").parse_args()

# Hyperparameters (rl-baselines3-zoo, sac.yml, Pendulum-v1; see the docstring). Those of the loop
# (1,000 random steps first, a replay buffer of 100,000 transitions, minibatches of 256) are
# helpers.SoftActorCriticPendulum's, shared by the SAC family.
GAMMA = 0.99
TAU = 0.005  # target networks: Q_target <- tau Q + (1 - tau) Q_target after each gradient step
LR = 1e-3  # actor, critics and temperature
HIDDEN = [256, 256]

# Seeds torch and makes Pendulum-v1: run.device, run.action_spec, run.obs_dim, run.action_dim.
run = helpers.SoftActorCriticPendulum(args)

# pi(a|s): a tanh-squashed Gaussian; two Q-networks (an ensemble evaluated in one vmap call) with
# target copies; the target entropy -dim(A) = -1 comes from the actor's spec.
actor = helpers.tanh_normal_actor(run.obs_dim, run.action_spec, HIDDEN)
critics = [helpers.q_critic(run.obs_dim, run.action_dim, HIDDEN) for _ in range(2)]
loss_module = SACLoss(actor, critics, loss_function="l2", alpha_init=1.0).to(run.device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
target_updater = SoftUpdate(loss_module, tau=TAU)
# One optimizer for actor, critics and log(alpha): each loss only reaches its own parameters.
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

# ---- The loop: act (uniformly at random for the first 1,000 steps, then a ~ pi(.|s)), store
# the transition; after those 1,000 steps, one update per env step: a gradient step on
# loss_qvalue + loss_actor + loss_alpha, then target_updater.step() (see
# helpers.soft_actor_critic_update); evaluate every --eval-every frames. Then save the learning
# curve, evaluate the final policy on start states training never scored, save the actor
# (--save-actor), report ----
run.train(actor, loss_module, optimizer, "SAC on Pendulum-v1", target_updater=target_updater)
