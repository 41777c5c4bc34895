"""Randomized ensembled double Q-learning (REDQ) on Pendulum-v1 with rlloss, on SAC's loop.

This tutorial trains SAC's tanh-Gaussian policy with an ensemble of critics through rlloss's
``REDQLoss`` (a drop-in replacement for ``torchrl.objectives.REDQLoss``). The pieces map to
"Randomized Ensembled Double Q-Learning: Learning Fast Without a Model" (Chen et al.,
arXiv:2101.05982, Algorithm 1):

1. an ensemble of N = 10 Q-networks (2x128 MLPs) with target copies; the agent acts with
   a ~ pi(.|s) and stores (s, a, r, s', terminated) in a replay buffer, as SAC does;
2. for every environment step, G gradient steps (the update-to-data ratio, UTD), each on the
   sum of ``REDQLoss``'s three outputs on a fresh minibatch:

   - ``loss_qvalue``: a subset J of M = 2 of the N target critics is drawn at random (line 7),
     y = r + gamma (1 - terminated) (min_{j in J} Q_j,target(s', a') - alpha log pi(a'|s')),
     a' ~ pi(.|s') (line 8), and every Q_i is regressed on y (line 9; squared error here);
   - ``loss_actor``: alpha log pi(a~|s) - 1/N sum_i Q_i(s, a~), the ensemble mean (line 13);
   - ``loss_alpha``: SAC's automatic temperature, target entropy -dim(A), over the
     log-probabilities of a~ and a'; TorchRL's REDQ clamps alpha into [min_alpha, max_alpha]
     (default [0.1, 10]); we lower min_alpha to 1e-3 because Pendulum's SAC settles near
     alpha = 0.05 and a floor of 0.1 keeps the policy noisier than it needs to be;

3. Q_target <- tau Q + (1 - tau) Q_target after every gradient step (line 10), with TorchRL's
   ``SoftUpdate``.

The paper uses G = 20 (and N = 10, M = 2, 256-unit critics) with one actor step per
environment step; here every gradient step moves the actor too (the losses come from one
``forward``, TorchRL's interface). On one CPU thread a REDQ update costs (measured, batch 256):
57 ms with ten 2x256 critics, 26 ms with ten 2x128 critics (SAC's: 18 ms), so even G = 1 with
256-unit critics takes about 20 minutes for 20k steps, and the paper's G = 20 about 6 hours.
To keep a run near SAC's cost (about 10 minutes) we use 2x128 critics and G = 1 by default;
``--utd G`` sets G (G = 2 doubles the time; a GPU, ``--device cuda``, runs the ensemble in
one vmap call and has room for the paper's G = 20). Everything else is ``sac_pendulum.py``'s
(the rl-zoo Pendulum SAC settings: 2x256 MLPs, batch 256, learning rate 1e-3, gamma 0.99,
tau 0.005, alpha learned from 1.0, 1,000 random steps first), so that the two differ only by
the loss, the critics' width and the UTD. The training loop is ``sac_pendulum.py``'s
with G gradient steps per environment step.

Results (20,000 steps, one CPU thread): seed 0, final_return (evaluation) -111.7; the evaluation
first reaches -200 at 4,000 steps (-128.2; -870.1 at 3,000); the last 10 training episodes
-182.9; wall 754 s (re-run through ``benchmarks/learning.py``: the same numbers, 1,067 s). Seeds
1 and 2 (``benchmarks/learning.py``): -106.4 and -158.8, both first at or above -200 at 4,000
steps; wall 1,011 s and 782 s. TorchRL's ``REDQLoss`` swapped in (``benchmarks/learning.py``):
-108.6, -106.2 and -159.5, first at or above -200 at 4,000 steps on all three seeds (the same as
rlloss); wall 1,035, 1,434 and 1,176 s.

Run:
    python tutorials/redq_pendulum.py --seed 0 --total-frames 20000 --out runs/redq_pendulum

It writes ``OUT/returns.csv`` (one row per finished episode), ``OUT/eval_returns.csv`` (the mean
return of the deterministic policy over 10 unseen start states every 1,000 steps) and
``OUT/curve.png``; it prints ``first_eval_at_target=`` (the first of those evaluations at or
above -200), ``train_return=``, ``eval_return=`` and last ``final_return=`` (the mean return of
the final deterministic policy's evaluation episodes).
"""

import _helpers as helpers  # tutorials/_helpers.py: the plumbing
import torch
from torchrl.objectives import SoftUpdate, ValueEstimators

from rlloss import REDQLoss

# --seed, --total-frames, --device, --out, --eval-every, --eval-episodes, --save-actor, --utd
parser = helpers.soft_actor_critic_parser(__doc__, "runs/redq_pendulum")
parser.add_argument("--utd", type=int, default=1,
                    help="G, gradient steps per environment step (update-to-data ratio)")
args = parser.parse_args()

# Hyperparameters: sac_pendulum.py's (the loop's in helpers.SoftActorCriticPendulum) and REDQ's.
GAMMA, TAU, LR = 0.99, 0.005, 1e-3
HIDDEN = [256, 256]  # the actor's
NUM_CRITICS = 10  # N
SUBSET = 2  # M, target critics in each target's minimum
CRITIC_CELLS = [128, 128]  # each critic's hidden layers (see the docstring)
MIN_ALPHA = 1e-3  # TorchRL's REDQ floor is 0.1

# Seeds torch and makes Pendulum-v1: run.device, run.action_spec, run.obs_dim, run.action_dim.
run = helpers.SoftActorCriticPendulum(args)

# pi(a|s): SAC's tanh-squashed Gaussian; N critics (one vmap call) with target copies; the target
# entropy -dim(A) = -1 comes from the actor's spec.
actor = helpers.tanh_normal_actor(run.obs_dim, run.action_spec, HIDDEN)
critics = [helpers.q_critic(run.obs_dim, run.action_dim, CRITIC_CELLS) for _ in range(NUM_CRITICS)]
loss_module = REDQLoss(actor, critics, num_qvalue_nets=NUM_CRITICS, sub_sample_len=SUBSET,
                       loss_function="l2", alpha_init=1.0, min_alpha=MIN_ALPHA).to(run.device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
target_updater = SoftUpdate(loss_module, tau=TAU)
# One optimizer for actor, critics and log(alpha): each loss only reaches its own parameters.
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

# ---- sac_pendulum.py's loop with G updates per env step: 1,000 random steps, then act with
# a ~ pi(.|s); after each env step, G times a gradient step on a fresh minibatch on
# loss_qvalue + loss_actor + loss_alpha, then the targets; evaluations every --eval-every
# frames; the learning curve, the final evaluation, the report ----
run.train(actor, loss_module, optimizer, "REDQ on Pendulum-v1", target_updater=target_updater,
          updates_per_step=args.utd)
