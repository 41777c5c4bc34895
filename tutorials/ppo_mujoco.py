"""PPO on a MuJoCo task (HalfCheetah-v5, Hopper-v5, Walker2d-v5) with rlloss, in a single file.

The collector, the loop and the update are all in this file; ``tutorials/_helpers.py`` only
parses the common flags, evaluates and plots. Hyperparameters are those of CleanRL's
``ppo_continuous_action.py`` (the "37 implementation details of PPO" for MuJoCo):

- one environment, rollouts of 2,048 steps, 10 epochs of 32 minibatches (64 transitions each);
- Adam (lr 3e-4 annealed linearly to 0, eps 1e-5), gradients clipped to norm 0.5;
- gamma 0.99, GAE lambda 0.95, clip 0.2 on the ratio and on the value, advantages normalised
  per minibatch, no entropy bonus;
- separate 64-64 tanh MLPs with orthogonal initialisation, a Gaussian policy with a
  state-independent log standard deviation (initialised at 0); actions clipped by the
  environment, never squashed;
- observations normalised by running statistics and clipped to [-10, 10]; rewards scaled by the
  running standard deviation of the discounted return and clipped to [-10, 10].

One difference from CleanRL, on purpose: CleanRL's loop treats the 1,000-step time limit as a
termination (it bootstraps with zero at truncation). Here ``("next", "terminated")`` stops
bootstrapping and ``("next", "done")`` only cuts the GAE trace, so a truncated episode is
bootstrapped from V(s_T) as the Markov property demands. ``--time-limit-as-termination``
restores CleanRL's rule (the Results page measures what it changes).

The loss is rlloss's ``ClipPPOLoss`` and ``GAE``; with ``--losses torchrl`` the very same loop
uses TorchRL's classes of the same name (``torchrl.objectives``), so the two can be compared run
for run. ``loss_critic`` with ``critic_coeff=0.25`` and ``loss_critic_type="l2"`` is CleanRL's
``0.5 * vf_coef * max((V - R)^2, (V_clipped - R)^2)`` with ``vf_coef=0.5``.

Run:
    python tutorials/ppo_mujoco.py --env-id HalfCheetah-v5 --seed 0 --out runs/ppo_halfcheetah

It writes ``OUT/returns.csv`` (the undiscounted return of every training episode),
``OUT/eval_returns.csv`` (the deterministic policy's mean return over 10 episodes, every
``--eval-every`` steps), ``OUT/curve.png`` and ``OUT/summary.json`` (final and best evaluation,
wall time, gradient steps per second); the last printed line is ``final_return=<mean return of
the final deterministic policy over --eval-episodes episodes>``.

Results (1M steps, 10 evaluation episodes) are on the documentation's Results page
(``docs/results.md``) next to CleanRL's published returns.
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
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, IndependentNormal, ProbabilisticActor, ValueOperator

parser = helpers.tutorial_parser(__doc__, "runs/ppo_mujoco", 1_000_000)
parser.add_argument("--env-id", default="HalfCheetah-v5")
parser.add_argument("--losses", choices=["rlloss", "torchrl"], default="rlloss",
                    help="whose ClipPPOLoss and GAE the loop uses")
parser.add_argument("--time-limit-as-termination", action="store_true",
                    help="CleanRL's rule: no bootstrapping at the time limit either")
helpers.evaluation_flags(parser, every=50_000)
args = parser.parse_args()

if args.losses == "torchrl":
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE
else:
    from rlloss import GAE, ClipPPOLoss

# Hyperparameters (CleanRL, ppo_continuous_action.py).
NUM_STEPS = 2048  # environment steps per rollout (one environment)
NUM_EPOCHS = 10
NUM_MINIBATCHES = 32  # minibatches of 2048 / 32 = 64 transitions
GAMMA, LMBDA = 0.99, 0.95
LR = 3e-4  # annealed linearly to 0
CLIP_EPSILON = 0.2  # on the ratio and on the value
CRITIC_COEFF = 0.25  # CleanRL's vf_coef 0.5 times its 0.5 in front of the squared error
MAX_GRAD_NORM = 0.5
OBS_CLIP, REWARD_CLIP = 10.0, 10.0

device, start_time = helpers.start(args)  # seeds torch, one CPU thread


# ---- Environment: raw returns recorded first, then CleanRL's normalisation wrappers ----
def make_env(env_id: str) -> tuple[gym.Env, gym.wrappers.NormalizeObservation]:
    env = gym.make(env_id)
    env = gym.wrappers.RecordEpisodeStatistics(env)  # info["episode"]["r"]: the raw return
    env = gym.wrappers.ClipAction(env)
    obs_norm = env = gym.wrappers.NormalizeObservation(env)
    env = gym.wrappers.TransformObservation(
        env, lambda obs: np.clip(obs, -OBS_CLIP, OBS_CLIP), env.observation_space)
    env = gym.wrappers.NormalizeReward(env, gamma=GAMMA)
    env = gym.wrappers.TransformReward(env, lambda r: float(np.clip(r, -REWARD_CLIP, REWARD_CLIP)))
    return env, obs_norm


env, obs_norm = make_env(args.env_id)
env.action_space.seed(args.seed)
obs_dim = env.observation_space.shape[0]
action_dim = env.action_space.shape[0]
action_low, action_high = env.action_space.low, env.action_space.high


# ---- Networks: separate 64-64 tanh MLPs, orthogonal initialisation ----
def orthogonal_mlp(in_features: int, out_features: int, last_std: float) -> MLP:
    """CleanRL's layer_init: orthogonal weights (gain sqrt(2), ``last_std`` for the output
    layer), zero biases."""
    net = MLP(in_features=in_features, out_features=out_features, num_cells=[64, 64],
              activation_class=nn.Tanh)
    linears = [module for module in net.modules() if isinstance(module, nn.Linear)]
    for i, layer in enumerate(linears):
        nn.init.orthogonal_(layer.weight, last_std if i == len(linears) - 1 else np.sqrt(2))
        nn.init.zeros_(layer.bias)
    return net


class StateIndependentScale(nn.Module):
    """loc -> (loc, scale): the policy's standard deviation exp(log_std) is one learned parameter
    per action dimension, the same in every state."""

    def __init__(self, action_dim: int) -> None:
        super().__init__()
        self.log_std = nn.Parameter(torch.zeros(action_dim))

    def forward(self, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return loc, self.log_std.exp().expand_as(loc)


# pi(a|s) = N(mu(s), diag(sigma^2)); the actor samples "action" and writes its log-probability.
actor = ProbabilisticActor(
    TensorDictModule(
        nn.Sequential(orthogonal_mlp(obs_dim, action_dim, 0.01), StateIndependentScale(action_dim)),
        in_keys=["observation"], out_keys=["loc", "scale"]),
    in_keys=["loc", "scale"],
    distribution_class=IndependentNormal,
    return_log_prob=True,
).to(device)
critic = ValueOperator(orthogonal_mlp(obs_dim, 1, 1.0), in_keys=["observation"]).to(device)

advantage_module = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic)
loss_module = ClipPPOLoss(
    actor_network=actor,
    critic_network=critic,
    clip_epsilon=CLIP_EPSILON,
    entropy_coeff=0.0,
    critic_coeff=CRITIC_COEFF,
    loss_critic_type="l2",
    normalize_advantage=True,
    clip_value=CLIP_EPSILON,
).to(device)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR, eps=1e-5)


# ---- Evaluation: the mean action on a fresh environment, with the training statistics ----
def deterministic_policy(observation: np.ndarray) -> np.ndarray:
    """mu(s) for a raw observation, normalised with the running statistics as they are now."""
    rms = obs_norm.obs_rms
    normalised = np.clip((observation - rms.mean) / np.sqrt(rms.var + obs_norm.epsilon),
                         -OBS_CLIP, OBS_CLIP)
    with torch.no_grad():
        td = TensorDict(observation=torch.as_tensor(normalised, dtype=torch.float32,
                                                    device=device))
        loc = actor.module[0](td)["loc"]  # the TensorDictModule writing loc and scale
    return np.clip(loc.cpu().numpy(), action_low, action_high)


evaluator = helpers.Evaluator(args.env_id, deterministic_policy, seed=10_000 + 100 * args.seed,
                              episodes=args.eval_episodes, every=args.eval_every)


def to_tensor(x, dtype=torch.float32) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=device)


# ---- Training ----
num_iterations = max(1, args.total_frames // NUM_STEPS)
minibatch_size = NUM_STEPS // NUM_MINIBATCHES
episodes = []  # (frames, raw episode return)
frames, gradient_steps, update_seconds = 0, 0, 0.0
obs, _ = env.reset(seed=args.seed)

for iteration in range(num_iterations):
    optimizer.param_groups[0]["lr"] = LR * (1.0 - iteration / num_iterations)

    # ---- Collect NUM_STEPS transitions with the current stochastic policy ----
    steps = []
    for _ in range(NUM_STEPS):
        # a ~ pi(.|s): TorchRL's actors return the mode unless asked to sample
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            td = actor(TensorDict(observation=to_tensor(obs)))
        next_obs, reward, terminated, truncated, info = env.step(td["action"].cpu().numpy())
        frames += 1
        # ("next", "observation") is the true successor, also at the end of an episode.
        td["next"] = TensorDict(observation=to_tensor(next_obs), reward=to_tensor([reward]),
                                terminated=to_tensor([terminated or (
                                    truncated and args.time_limit_as_termination)], torch.bool),
                                done=to_tensor([terminated or truncated], torch.bool))
        steps.append(td.exclude("loc", "scale"))
        if terminated or truncated:
            episodes.append((frames, float(info["episode"]["r"])))
            next_obs, _ = env.reset()
        obs = next_obs
        evaluator.maybe(frames)
    rollout = torch.stack(steps)  # [NUM_STEPS]: time is the (only) batch dimension

    # ---- GAE with the pre-update critic: "advantage", "value_target", "state_value" ----
    with torch.no_grad():
        advantage_module(rollout)

    # ---- NUM_EPOCHS epochs of minibatch Adam steps on the sum of the loss_* terms ----
    update_start = time.process_time()  # CPU seconds: fair under load
    for _ in range(NUM_EPOCHS):
        for idx in torch.randperm(NUM_STEPS, device=device).split(minibatch_size):
            losses = loss_module(rollout[idx])
            loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            gradient_steps += 1
    update_seconds += time.process_time() - update_start

    recent = [episode_return for _, episode_return in episodes[-10:]]
    if iteration % 10 == 0 or iteration == num_iterations - 1:
        mean_recent = np.mean(recent) if recent else float("nan")
        print(f"frames={frames} mean_return_last_10={mean_recent:.1f}", flush=True)
env.close()

# ---- Save the curves, evaluate the final policy (prints final_return=...), write the summary ----
eval_returns = helpers.finish(args, start_time, episodes, f"PPO on {args.env_id} ({args.losses})",
                              evaluator=evaluator)
evaluations = [ret for _, ret in evaluator.evaluations] + [float(np.mean(eval_returns))]
summary = {
    "algorithm": "PPO", "env_id": args.env_id, "losses": args.losses, "seed": args.seed,
    "frames": frames, "final_eval_return": float(np.mean(eval_returns)),
    "best_eval_return": max(evaluations), "wall_time_s": time.perf_counter() - start_time,
    "cpu_time_s": time.process_time(),
    "variant": "time limit as termination" if args.time_limit_as_termination else "",
    "gradient_steps": gradient_steps,
    "gradient_steps_per_s": gradient_steps / update_seconds if update_seconds else float("nan"),
    "versions": helpers.package_versions(),
}
(args.out / "summary.json").write_text(json.dumps(summary, indent=1))
