"""Truncated quantile critics (TQC) on Pendulum-v1 with rlloss, on SAC's training loop.

This tutorial trains SAC's tanh-Gaussian policy with distributional critics through rlloss's
``TQCLoss`` (a drop-in replacement for ``torchrl.objectives.TQCLoss``). The pieces map to
"Controlling Overestimation Bias with Truncated Mixture of Continuous Distributional Quantile
Critics" (Kuznetsov et al., arXiv:2005.04269, Algorithm 1):

1. N = 5 critics, each an MLP writing M = 25 atoms theta_n^m(s, a) (the quantiles at levels
   tau_m = (2m - 1) / (2M) of Z_n(s, a)); the agent acts with a ~ pi(.|s) and stores
   (s, a, r, s', terminated) in a replay buffer, as SAC does;
2. for every environment step, one gradient step on the sum of ``TQCLoss``'s three outputs:

   - ``loss_qvalue``: the target critics' N M = 125 atoms at (s', a'), a' ~ pi(.|s'), are
     pooled and sorted and the d N = 2 x 5 = 10 largest dropped (d = 2 per net,
     ``top_quantiles_to_drop_per_net``; eq. 10: the truncation that controls overestimation);
     each kept atom gives y_k = r + gamma (1 - terminated) (z_(k) - alpha log pi(a'|s'))
     (eq. 11), and each critic is trained by the quantile Huber loss (kappa = 1) of its 25
     atoms against all 115 y_k (eq. 12), summed over the critics;
   - ``loss_actor``: alpha log pi(a~|s) - 1/(N M) sum_n sum_m theta_n^m(s, a~), the mean of
     every (untruncated) atom (eq. 13);
   - ``loss_alpha``: SAC's automatic temperature, target entropy -dim(A);
3. Q_target <- tau Q + (1 - tau) Q_target with TorchRL's ``SoftUpdate``.

The paper's hyperparameters are N = 5, M = 25, d = 2 on most MuJoCo tasks (d from 0 to 5 by
task), 256-unit layers (3 for the critics, 2 for the actor), batch 256, learning rate 3e-4,
one update per step. We keep N, M and d and take everything else from ``sac_pendulum.py`` (the
rl-zoo Pendulum SAC settings: 2x256 MLPs, learning rate 1e-3, gamma 0.99, tau 0.005, alpha
learned from 1.0, 1,000 random steps first), so that the two differ only by the loss. The
training loop is ``sac_pendulum.py``'s.

Results (20,000 steps, ``benchmarks/learning.py``, one CPU thread): final_return (evaluation)
-108.9, -108.9 and -157.7 on seeds 0, 1, 2 (seed 2's evaluation start states are the hard ones:
SAC -160.3, REDQ -158.8 on them); the evaluation first at or above -200 at 4,000 steps on all
three seeds (-180.2, -126.9, -169.4; -640.6, -656.8, -837.0 at 3,000), as SAC's first crossings
(4,000 and 5,000) and REDQ's (4,000); the last 10 training episodes -177.8, -189.9, -194.1;
wall 3,499, 3,014 and 3,437 s. TorchRL's ``TQCLoss`` swapped in, seeds 0, 1, 2: final_return
-109.9, -105.3, -159.0, first at or above -200 at 4,000 steps on all three (-128.0, -126.7,
-169.6), the last 10 training episodes -179.2, -188.4, -201.7; wall 4,883, 4,419 and 4,301 s.

Run:
    python tutorials/tqc_pendulum.py --seed 0 --total-frames 20000 --out runs/tqc_pendulum

It writes ``OUT/returns.csv`` (one row per finished episode), ``OUT/eval_returns.csv`` (the mean
return of the deterministic policy over 10 unseen start states every 1,000 steps) and
``OUT/curve.png``; it prints ``first_eval_at_target=`` (the first of those evaluations at or
above -200), ``train_return=``, ``eval_return=`` and last ``final_return=`` (the mean return of
the final deterministic policy's evaluation episodes).
"""

import _helpers as helpers  # tutorials/_helpers.py: the plumbing
import torch
from torchrl.objectives import SoftUpdate, ValueEstimators

from rlloss import TQCLoss

# --seed, --total-frames, --device, --out, --eval-every, --eval-episodes, --save-actor
args = helpers.soft_actor_critic_parser(__doc__, "runs/tqc_pendulum").parse_args()

# Hyperparameters: sac_pendulum.py's (the loop's in helpers.SoftActorCriticPendulum) and TQC's.
GAMMA, TAU, LR, HIDDEN = 0.99, 0.005, 1e-3, [256, 256]
NUM_CRITICS = 5  # N
NUM_QUANTILES = 25  # M, atoms per critic
DROP_PER_NET = 2  # d: the pooled target drops its d N largest atoms

# Seeds torch and makes Pendulum-v1: run.device, run.action_spec, run.obs_dim, run.action_dim.
run = helpers.SoftActorCriticPendulum(args)

# pi(a|s): SAC's tanh-squashed Gaussian; N quantile critics (one vmap call) with target copies;
# the target entropy -dim(A) = -1 comes from the actor's spec.
actor = helpers.tanh_normal_actor(run.obs_dim, run.action_spec, HIDDEN)
critics = [helpers.q_critic(run.obs_dim, run.action_dim, HIDDEN, num_atoms=NUM_QUANTILES)
           for _ in range(NUM_CRITICS)]
loss_module = TQCLoss(actor, critics, num_qvalue_nets=NUM_CRITICS,
                      top_quantiles_to_drop_per_net=DROP_PER_NET, alpha_init=1.0).to(run.device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)  # as TorchRL takes gamma
target_updater = SoftUpdate(loss_module, tau=TAU)
# One optimizer for actor, critics and log(alpha): each loss only reaches its own parameters.
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

# ---- sac_pendulum.py's loop: 1,000 random steps, then act with a ~ pi(.|s); one gradient step
# per env step on loss_qvalue + loss_actor + loss_alpha, then the targets; evaluations every
# --eval-every frames; the learning curve, the final evaluation, the report ----
run.train(actor, loss_module, optimizer, "TQC on Pendulum-v1", target_updater=target_updater)
