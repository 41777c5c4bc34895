"""SAC on a MuJoCo task (HalfCheetah-v5, Hopper-v5) with rlloss, in a single file.

The collector, the replay buffer, the loop and the update are all in this file;
``tutorials/_helpers.py`` only parses the common flags, evaluates and plots. Hyperparameters are
those of CleanRL's ``sac_continuous_action.py``:

- 5,000 uniformly random steps first, then one update per environment step on a batch of 256
  transitions sampled from a 1M-transition replay buffer (TorchRL's ``TensorDictReplayBuffer``);
- two Q networks and a tanh-Gaussian policy, 256-256 ReLU MLPs; the policy's log standard
  deviation squashed into [-5, 2] by a tanh (SpinUp's mapping);
- Adam: lr 1e-3 for the Q networks and the temperature, 3e-4 for the policy; gamma 0.99;
  target Q networks updated every step with tau 0.005;
- the temperature tuned automatically (initial alpha 1, target entropy -dim(A));
- one Q, one policy and one temperature update per environment step, as many as CleanRL makes
  (CleanRL: two policy and temperature updates every second step).

Differences from CleanRL, on purpose: ``("next", "terminated")`` alone stops bootstrapping (a
1,000-step time limit is not a termination; CleanRL agrees); each step is one forward of the loss
and one backward of ``loss_qvalue + loss_actor + loss_alpha``, so the policy's loss uses the Q
networks before that step's update (CleanRL computes it after, in a second forward, and groups
the policy steps in pairs): half the forward passes, the same number of updates, TorchRL's SAC
example's schedule. ``SACLoss`` detaches the Q networks in ``loss_actor`` and ``log pi`` in
``loss_alpha``, so each loss reaches only its own parameters. The losses are rlloss's ``SACLoss``
(TorchRL's conventions: ``loss_qvalue`` is the summed squared error of the two critics, and
``loss_alpha`` is ``-log(alpha) (log pi + target entropy)``, whose gradient differs from CleanRL's
``-alpha (log pi + target entropy)`` by the factor alpha).

``--schedule cleanrl`` runs CleanRL's own update instead, with the same networks and losses
(TorchRL's per-term methods, which both libraries' ``SACLoss`` have): each step one critic step on
``qvalue_v2_loss``, and every second step two policy steps on ``actor_loss``, each followed by a
temperature step on CleanRL's loss ``-alpha (log pi + target entropy)`` with ``log pi`` of a fresh
sample of the updated policy; three Adam optimizers, the same learning rates. It measures what the
schedule alone changes.

With ``--losses torchrl`` the very same loop uses TorchRL's ``SACLoss`` and ``SoftUpdate``. With
``--compile`` each update is one compiled callable (``rlloss.compile_update``: forward,
backward, Adam step and target update); the maths is the same, only the rounding of the fused
kernels differs. On a CPU it is slower than eager for these ReLU networks (torch 2.13 writes
their backward masks slowly: the guide "One compiled update", section "On the CPU").

Run:
    python tutorials/sac_mujoco.py --env-id HalfCheetah-v5 --seed 0 --out runs/sac_halfcheetah

It writes ``OUT/returns.csv`` (the return of every training episode), ``OUT/eval_returns.csv``
(the deterministic policy's mean return over 10 episodes, every ``--eval-every`` steps),
``OUT/curve.png`` and ``OUT/summary.json``; the last printed line is ``final_return=<mean return
of the final deterministic policy>``. Results are on the documentation's Results page.
"""

import json
import time

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Bounded, LazyTensorStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import ValueEstimators

parser = helpers.tutorial_parser(__doc__, "runs/sac_mujoco", 300_000)
parser.add_argument("--env-id", default="HalfCheetah-v5")
parser.add_argument("--losses", choices=["rlloss", "torchrl"], default="rlloss",
                    help="whose SACLoss and SoftUpdate the loop uses")
parser.add_argument("--learning-starts", type=int, default=5_000,
                    help="uniformly random actions and no update before this step")
parser.add_argument("--compile", action="store_true",
                    help="run each update as one torch.compile'd callable (compile_update)")
parser.add_argument("--schedule", choices=["one-pass", "cleanrl"], default="one-pass",
                    help="one forward and backward of the three losses per step, or CleanRL's "
                         "update (critic step, then two policy and temperature steps every "
                         "second step)")
helpers.evaluation_flags(parser, every=10_000)
helpers.denormal_flag(parser)
args = parser.parse_args()
if args.compile and args.schedule == "cleanrl":
    parser.error("--compile compiles the one-pass update; run --schedule cleanrl without it")

if args.losses == "torchrl":
    from torchrl.objectives import SACLoss, SoftUpdate
else:
    from rlloss import SACLoss, SoftUpdate

# Hyperparameters (CleanRL, sac_continuous_action.py).
BUFFER_SIZE = 1_000_000
BATCH_SIZE = 256
GAMMA, TAU = 0.99, 0.005
POLICY_LR, Q_LR = 3e-4, 1e-3  # the temperature uses Q_LR
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

device, start_time = helpers.start(args)  # seeds torch, one CPU thread
helpers.flush_denormals(args)  # unless --keep-denormals: see tutorials/_helpers.py

env = gym.wrappers.RecordEpisodeStatistics(gym.make(args.env_id))
env.action_space.seed(args.seed)
obs_dim = env.observation_space.shape[0]
action_dim = env.action_space.shape[0]
low = torch.as_tensor(env.action_space.low, device=device)
high = torch.as_tensor(env.action_space.high, device=device)


class GaussianHead(nn.Module):
    """A 256-256 ReLU MLP writing the mean and the standard deviation of the pre-tanh Gaussian;
    log sigma = LOG_STD_MIN + (LOG_STD_MAX - LOG_STD_MIN) (tanh(x) + 1) / 2."""

    def __init__(self) -> None:
        super().__init__()
        self.net = MLP(in_features=obs_dim, out_features=2 * action_dim, num_cells=[256, 256],
                       activation_class=nn.ReLU)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, raw_log_std = self.net(observation).chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw_log_std) + 1)
        return loc, log_std.exp()


# pi(a|s): tanh of a Gaussian sample, scaled to the action bounds.
actor = ProbabilisticActor(
    TensorDictModule(GaussianHead(), in_keys=["observation"], out_keys=["loc", "scale"]),
    in_keys=["loc", "scale"],
    distribution_class=TanhNormal,
    distribution_kwargs={"low": low, "high": high},
).to(device)
# Q(s, a): TorchRL's MLP concatenates its inputs; SACLoss makes two independent copies.
qvalue = ValueOperator(
    MLP(in_features=obs_dim + action_dim, out_features=1, num_cells=[256, 256],
        activation_class=nn.ReLU),
    in_keys=["observation", "action"],
).to(device)

# target_entropy="auto" is -dim(A), read from the action spec.
action_spec = Bounded(low=low, high=high, shape=low.shape, device=device)
loss_module = SACLoss(actor_network=actor, qvalue_network=qvalue, num_qvalue_nets=2,
                      loss_function="l2", alpha_init=1.0, action_spec=action_spec,
                      target_entropy="auto").to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
target_update = SoftUpdate(loss_module, tau=TAU)
# One Adam over three parameter groups (Adam is per parameter: the same as three optimizers).
optimizer = torch.optim.Adam([
    {"params": list(loss_module.qvalue_network_params.flatten_keys().values()), "lr": Q_LR},
    {"params": list(loss_module.actor_network_params.flatten_keys().values()), "lr": POLICY_LR},
    {"params": [loss_module.log_alpha], "lr": Q_LR},
])
LOSS_KEYS = ["loss_qvalue", "loss_actor", "loss_alpha"]


def update(batch: TensorDict) -> None:
    """One forward, one backward of the three losses, one Adam step, the soft target update."""
    losses = loss_module(batch)
    optimizer.zero_grad()
    sum(losses[key] for key in LOSS_KEYS).backward()
    optimizer.step()
    target_update.step()


if args.compile:  # the same update as one compiled callable
    from rlloss import compile_update

    update = compile_update(loss_module, optimizer, loss_keys=LOSS_KEYS,
                            target_updater=target_update)

# ---- --schedule cleanrl: CleanRL's update (sac_continuous_action.py), step by step ----
POLICY_FREQUENCY = 2  # CleanRL's policy_frequency: two policy steps every second step
TARGET_ENTROPY = -float(action_dim)
q_optimizer, actor_optimizer, alpha_optimizer = (
    torch.optim.Adam([group], lr=group["lr"]) for group in optimizer.param_groups)
# the optimizers that step: one per parameter group, or the one-pass update's one for all three
stepped = ((q_optimizer, actor_optimizer, alpha_optimizer) if args.schedule == "cleanrl"
           else (optimizer,) * 3)
active_optimizers = list(dict.fromkeys(stepped))


def cleanrl_update(batch: TensorDict, step: int) -> None:
    """One critic step; on every second step, two steps of the policy, each followed by one of
    the temperature on CleanRL's loss; then the soft target update."""
    loss_qvalue, _ = loss_module.qvalue_v2_loss(batch)
    q_optimizer.zero_grad()
    loss_qvalue.backward()
    q_optimizer.step()
    if step % POLICY_FREQUENCY == 0:
        for _ in range(POLICY_FREQUENCY):
            loss_actor, _ = loss_module.actor_loss(batch)  # the critics just updated
            actor_optimizer.zero_grad()
            loss_actor.backward()
            actor_optimizer.step()
            with torch.no_grad():  # log pi of a fresh sample of the updated policy
                log_prob = loss_module.actor_loss(batch)[1]["log_prob"]
            loss_alpha = -(loss_module.log_alpha.exp() * (log_prob + TARGET_ENTROPY)).mean()
            alpha_optimizer.zero_grad()
            loss_alpha.backward()
            alpha_optimizer.step()
    target_update.step()


buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER_SIZE, device=device),
                                batch_size=BATCH_SIZE)


def deterministic_policy(observation: np.ndarray) -> np.ndarray:
    """The squashed mean action tanh(mu(s)), scaled to the bounds."""
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        td = actor(TensorDict(observation=torch.as_tensor(observation, dtype=torch.float32,
                                                          device=device)))
    return td["action"].cpu().numpy()


evaluator = helpers.Evaluator(args.env_id, deterministic_policy, seed=10_000 + 100 * args.seed,
                              episodes=args.eval_episodes, every=args.eval_every)


def to_tensor(x, dtype=torch.float32) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=device)


episodes = []  # (frames, episode return)
gradient_steps, update_seconds = 0, 0.0
update_rate = helpers.UpdateRate()
obs, _ = env.reset(seed=args.seed)
for frames in range(1, args.total_frames + 1):
    # ---- Act: uniformly at random first, then a sample of the tanh-Gaussian policy ----
    if frames <= args.learning_starts:
        action = env.action_space.sample()
    else:
        # a ~ pi(.|s): TorchRL's actors return the mode unless asked to sample
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            action = actor(TensorDict(observation=to_tensor(obs)))["action"].cpu().numpy()
    next_obs, reward, terminated, truncated, info = env.step(action)
    buffer.add(TensorDict(
        observation=to_tensor(obs), action=to_tensor(action),
        next=TensorDict(observation=to_tensor(next_obs), reward=to_tensor([reward]),
                        terminated=to_tensor([terminated], torch.bool),
                        done=to_tensor([terminated or truncated], torch.bool))))
    if terminated or truncated:
        episodes.append((frames, float(info["episode"]["r"])))
        next_obs, _ = env.reset()
    obs = next_obs

    # ---- Update: the Q networks, the policy and the temperature, once per step ----
    if frames > args.learning_starts:
        update_start = time.process_time()  # CPU seconds: fair under load
        if args.schedule == "cleanrl":
            cleanrl_update(buffer.sample(), frames)
        else:
            update(buffer.sample())
        gradient_steps += 1
        update_seconds += time.process_time() - update_start
    evaluator.maybe(frames)

    if frames % 10_000 == 0:
        recent = [episode_return for _, episode_return in episodes[-10:]]
        alpha = loss_module.log_alpha.exp().item()
        mean_recent = np.mean(recent) if recent else float("nan")
        print(f"frames={frames} mean_return_last_10={mean_recent:.1f} alpha={alpha:.3f} "
              f"updates_per_cpu_s={update_rate(gradient_steps, update_seconds):.0f} "
              f"subnormal_share={helpers.subnormal_share(active_optimizers):.1e}", flush=True)
env.close()


def adam_steps() -> dict:
    """The Adam steps each parameter group has taken (the schedule, as run)."""
    return {name: int(adam.state.get(group["params"][0], {}).get("step", 0))
            for name, adam, group in zip(("qvalue", "actor", "alpha"), stepped,
                                          optimizer.param_groups, strict=True)}


# ---- Save the curves, evaluate the final policy (prints final_return=...), write the summary ----
eval_returns = helpers.finish(args, start_time, episodes, f"SAC on {args.env_id} ({args.losses})",
                              evaluator=evaluator)
evaluations = [ret for _, ret in evaluator.evaluations] + [float(np.mean(eval_returns))]
summary = {
    "algorithm": "SAC", "env_id": args.env_id, "losses": args.losses, "seed": args.seed,
    "frames": args.total_frames, "final_eval_return": float(np.mean(eval_returns)),
    "best_eval_return": max(evaluations), "wall_time_s": time.perf_counter() - start_time,
    "cpu_time_s": time.process_time(),
    "subnormals": "kept" if args.keep_denormals else "flushed",
    "variant": "compiled" if args.compile else
               "cleanrl schedule" if args.schedule == "cleanrl" else "",
    "updates": gradient_steps,
    "adam_steps": adam_steps(),
    "updates_per_s": gradient_steps / update_seconds if update_seconds else float("nan"),
    "versions": helpers.package_versions(),
}
(args.out / "summary.json").write_text(json.dumps(summary, indent=1))
