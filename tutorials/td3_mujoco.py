"""TD3 on a MuJoCo task (HalfCheetah-v5, Hopper-v5) with rlloss, in a single file.

The collector, the replay buffer, the loop and the update are all in this file;
``tutorials/_helpers.py`` only parses the common flags, evaluates and plots. Hyperparameters are
those of CleanRL's ``td3_continuous_action.py`` (Fujimoto et al. 2018, arXiv:1802.09477):

- 25,000 uniformly random steps first, then one critic update per environment step on a batch
  of 256 transitions from a 1M-transition replay buffer (TorchRL's ``TensorDictReplayBuffer``);
- exploration: the deterministic action plus Gaussian noise of standard deviation 0.1 (times the
  action scale), clipped to the bounds;
- two Q networks (clipped double Q) and a deterministic tanh policy, 256-256 ReLU MLPs; Adam,
  lr 3e-4 for both; gamma 0.99;
- target policy smoothing: noise N(0, 0.2) clipped to +-0.5 on the target action;
- delayed policy updates: the policy and all target networks (tau 0.005) every second step.

Differences from CleanRL, on purpose: ``("next", "terminated")`` alone stops bootstrapping (a
time limit is not a termination; CleanRL agrees); the policy's loss on a policy step is computed
in the same forward as the critics' loss, so it uses the critics before that step's update
(CleanRL computes it after); the losses are rlloss's ``TD3Loss`` with TorchRL's conventions
(``loss_qvalue`` sums the two critics' squared errors).

With ``--losses torchrl`` the very same loop uses TorchRL's ``TD3Loss`` and ``SoftUpdate``.

Run:
    python tutorials/td3_mujoco.py --env-id HalfCheetah-v5 --seed 0 --out runs/td3_halfcheetah

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
from torchrl.modules import MLP, ValueOperator
from torchrl.objectives import ValueEstimators

parser = helpers.tutorial_parser(__doc__, "runs/td3_mujoco", 300_000)
parser.add_argument("--env-id", default="HalfCheetah-v5")
parser.add_argument("--losses", choices=["rlloss", "torchrl"], default="rlloss",
                    help="whose TD3Loss and SoftUpdate the loop uses")
parser.add_argument("--learning-starts", type=int, default=25_000,
                    help="uniformly random actions and no update before this step")
helpers.evaluation_flags(parser, every=10_000)
helpers.denormal_flag(parser)
args = parser.parse_args()

if args.losses == "torchrl":
    from torchrl.objectives import SoftUpdate, TD3Loss
else:
    from rlloss import SoftUpdate, TD3Loss

# Hyperparameters (CleanRL, td3_continuous_action.py).
BUFFER_SIZE = 1_000_000
BATCH_SIZE = 256
GAMMA, TAU = 0.99, 0.005
LR = 3e-4  # policy and Q networks
EXPLORATION_NOISE = 0.1  # times the action scale
POLICY_NOISE, NOISE_CLIP = 0.2, 0.5  # target policy smoothing
POLICY_FREQUENCY = 2  # the policy and the target networks are updated every second step

device, start_time = helpers.start(args)  # seeds torch, one CPU thread
helpers.flush_denormals(args)  # unless --keep-denormals: see tutorials/_helpers.py

env = gym.wrappers.RecordEpisodeStatistics(gym.make(args.env_id))
env.action_space.seed(args.seed)
obs_dim = env.observation_space.shape[0]
action_dim = env.action_space.shape[0]
low = torch.as_tensor(env.action_space.low, device=device)
high = torch.as_tensor(env.action_space.high, device=device)


class ScaledTanhPolicy(nn.Module):
    """mu(s) = scale * tanh(MLP(s)) + bias: a 256-256 ReLU MLP squashed into the action bounds."""

    def __init__(self) -> None:
        super().__init__()
        self.net = MLP(in_features=obs_dim, out_features=action_dim, num_cells=[256, 256],
                       activation_class=nn.ReLU)
        self.register_buffer("scale", (high - low) / 2)
        self.register_buffer("bias", (high + low) / 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.scale * torch.tanh(self.net(observation)) + self.bias


actor = TensorDictModule(ScaledTanhPolicy(), in_keys=["observation"], out_keys=["action"])
actor = actor.to(device)
# Q(s, a): TorchRL's MLP concatenates its inputs; TD3Loss makes two independent copies.
qvalue = ValueOperator(
    MLP(in_features=obs_dim + action_dim, out_features=1, num_cells=[256, 256],
        activation_class=nn.ReLU),
    in_keys=["observation", "action"],
).to(device)

action_spec = Bounded(low=low, high=high, shape=low.shape, device=device)
loss_module = TD3Loss(actor_network=actor, qvalue_network=qvalue, action_spec=action_spec,
                      num_qvalue_nets=2, policy_noise=POLICY_NOISE, noise_clip=NOISE_CLIP,
                      loss_function="l2").to(device)
loss_module.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
target_update = SoftUpdate(loss_module, tau=TAU)
q_optimizer = torch.optim.Adam(loss_module.qvalue_network_params.flatten_keys().values(), lr=LR)
actor_optimizer = torch.optim.Adam(loss_module.actor_network_params.flatten_keys().values(), lr=LR)

buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER_SIZE, device=device),
                                batch_size=BATCH_SIZE)


def deterministic_policy(observation: np.ndarray) -> np.ndarray:
    """mu(s), without exploration noise."""
    with torch.no_grad():
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
    # ---- Act: uniformly at random first, then mu(s) + N(0, (0.1 scale)^2), clipped ----
    if frames <= args.learning_starts:
        action = env.action_space.sample()
    else:
        with torch.no_grad():
            mu = actor(TensorDict(observation=to_tensor(obs)))["action"]
            noisy = mu + torch.randn_like(mu) * actor.module.scale * EXPLORATION_NOISE
            action = torch.maximum(torch.minimum(noisy, high), low).cpu().numpy()
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

    # ---- Update: Q networks every step; the policy and the targets every second step ----
    if frames > args.learning_starts:
        update_start = time.process_time()  # CPU seconds: fair under load
        losses = loss_module(buffer.sample())
        policy_step = frames % POLICY_FREQUENCY == 0
        q_optimizer.zero_grad()
        actor_optimizer.zero_grad()
        # loss_actor = -Q_1(s, mu(s)) reaches the policy's parameters only.
        (losses["loss_qvalue"] + losses["loss_actor"] if policy_step
         else losses["loss_qvalue"]).backward()
        q_optimizer.step()
        if policy_step:
            actor_optimizer.step()
            target_update.step()
        gradient_steps += 1
        update_seconds += time.process_time() - update_start
    evaluator.maybe(frames)

    if frames % 10_000 == 0:
        recent = [episode_return for _, episode_return in episodes[-10:]]
        mean_recent = np.mean(recent) if recent else float("nan")
        print(f"frames={frames} mean_return_last_10={mean_recent:.1f} "
              f"updates_per_cpu_s={update_rate(gradient_steps, update_seconds):.0f} "
              f"subnormal_share={helpers.subnormal_share([q_optimizer, actor_optimizer]):.1e}",
              flush=True)
env.close()

# ---- Save the curves, evaluate the final policy (prints final_return=...), write the summary ----
eval_returns = helpers.finish(args, start_time, episodes, f"TD3 on {args.env_id} ({args.losses})",
                              evaluator=evaluator)
evaluations = [ret for _, ret in evaluator.evaluations] + [float(np.mean(eval_returns))]
summary = {
    "algorithm": "TD3", "env_id": args.env_id, "losses": args.losses, "seed": args.seed,
    "frames": args.total_frames, "final_eval_return": float(np.mean(eval_returns)),
    "best_eval_return": max(evaluations), "wall_time_s": time.perf_counter() - start_time,
    "cpu_time_s": time.process_time(),
    "subnormals": "kept" if args.keep_denormals else "flushed",
    "updates": gradient_steps,
    "updates_per_s": gradient_steps / update_seconds if update_seconds else float("nan"),
    "versions": helpers.package_versions(),
}
(args.out / "summary.json").write_text(json.dumps(summary, indent=1))
