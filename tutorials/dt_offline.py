"""A Decision Transformer from a fixed Pendulum-v1 dataset with rlloss, conditioned on a target return.

The Decision Transformer (Chen et al., arXiv:2106.01345) treats a trajectory as a sequence of
(return-to-go R_t, state s_t, action a_t) tokens and trains a causal transformer to predict a_t
from the tokens up to s_t; at test time it is prompted with the return it should reach.

1. the mixed dataset of ``offline_dataset.py --agent-frames 0 3000 5000 --total-frames 60000``
   (100 episodes each of uniform random actions, of SAC after 3,000 steps and of SAC after
   5,000: mean returns -1221.8, -860.9 and -145.4 for seed 0) is cut back into its episodes
   (10 environments stepped together, 200 steps each), with R_t = sum_{t' >= t} r_t' scaled by
   1/100 (Pendulum's returns are hundreds where the paper's are thousands, which it scales by
   1/1000: either way R_t is of order 1 to 10) and observations standardised;
2. the actor is TorchRL's: ``DTActor`` (a GPT-2 over the three embedded tokens) in a
   ``ProbabilisticActor`` with a ``TanhDelta`` head onto the action bounds, as in the example
   of TorchRL's ``DecisionTransformerInferenceWrapper``;
3. ``DTLoss`` (a drop-in for ``torchrl.objectives.DTLoss``): the squared error of the
   predicted actions against the dataset's over windows of ``CONTEXT`` steps (sec. 3);
4. evaluation: ``DecisionTransformerInferenceWrapper`` picks the last action of the window;
   R_0 is ``--target-return`` (default: the best behaviour policy's mean return; on a dataset
   of one policy the dataset's mean) and after each step R_{t+1} = R_t - r_t. The final policy
   is also prompted with each of ``--eval-targets`` (default: every behaviour policy's mean
   return) on the same start states: the return it reaches should rise with the prompt.

Results (1,000 gradient steps, the default; the mixed dataset of seed 0; the return reached,
mean of 10 prompted episodes on start states the dataset never saw, the same ones for every
prompt; the TorchRL rows are this script with ``DTLoss`` imported from ``torchrl.objectives``
by ``tools/tutorial_runs.py``, same seeds), re-measured on 2026-11-29 (rlloss 06e7bed):

    prompt (target return)        -1221.8 (random)  -860.9 (medium)  -145.4 (expert)
    rlloss  seed 0              -860.1            -843.6           -481.5   (rises)
    rlloss  seed 1             -1104.1           -1074.2           -586.0   (rises)
    rlloss  seed 2             -1128.0           -1121.0          -1056.8   (barely rises)
    TorchRL seed 0              -860.1            -843.6           -481.5   (rises)
    TorchRL seed 1             -1104.1           -1074.2           -586.0   (rises)
    TorchRL seed 2             -1128.0           -1121.0          -1056.8   (barely rises)

The mixed dataset itself moved since the earlier record: its medium and expert policies (SAC
agents trained with rlloss's ``SACLoss`` by ``offline_dataset.py``) now return -860.9 and -145.4
(were -837.3 and -144.1), so the prompts, which are those returns, moved with them. The earlier
record, on that dataset: -934.9, -909.2, -403.5 (seed 0), -1035.1, -989.2, -492.6 (seed 1),
-1160.3, -1146.9, -1166.7 (seed 2), the same with either library.

On seeds 0 and 1 the return reached rises with the prompt, with either library (the same
returns to the digit): prompted with the expert's return it reaches -481.5 and -586.0, 0.68
and 0.58 of the expert as (R - R_random) / (R_expert - R_random) with R_expert = -145.4 and
R_random = -1204 (uniform random actions on the evaluation start states, 30 episodes);
prompted with the medium or the random policy's return it stays near the bottom, -844 to
-1104 (the random prompt imitates the mean of uniform actions, about no torque, so it reaches
more than -1221.8; the medium prompt only slightly more than the random one). On seed 2 the
transformer has barely learnt to swing the pendulum up in 1,000 steps (every prompt -1057 to
-1128). Trained twice as long (``--total-frames 2000``, rlloss), seed 2 reaches -1168.1,
-1111.4 and -866.5 for the three prompts: rising, as on the other seeds (the earlier record:
-1199.9, -1148.8 and -920.3).

Earlier version (returns-to-go scaled by 1/1000, trained on the expert dataset of
``--agent-frames 5000`` alone, mean return -149.7): -124.9, -109.8, -160.5 on seeds 0, 1, 2
with either library, 1.02, 1.04, 0.99 of the expert; prompted with -400 seed 0 reached -125.0
as with -149.7: an expert-only dataset gives the transformer no lower-return behaviour to
condition on. With 1/1000 on the mixed dataset, seed 0 reached -352.1, -354.9 and -362.8 for
the three prompts: returns-to-go between -1.2 and 0 barely moved the transformer, which learnt
one average policy. Figures in benchmarks/results/offline.json.

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them (``<offline_dataset ...>``: the output directory of that run,
made first):

    [figures] rlloss, seeds 0 1 2, --total-frames 1000 --dataset <offline_dataset --seed 0 --agent-frames 0 3000 5000 --total-frames 60000>/dataset: return_at_target[-1221.8] = -860.1 -1104.1 -1128.0
    [figures] rlloss, seeds 0 1 2, --total-frames 1000 --dataset <offline_dataset --seed 0 --agent-frames 0 3000 5000 --total-frames 60000>/dataset: return_at_target[-860.9] = -843.6 -1074.2 -1121.0
    [figures] rlloss, seeds 0 1 2, --total-frames 1000 --dataset <offline_dataset --seed 0 --agent-frames 0 3000 5000 --total-frames 60000>/dataset: return_at_target[-145.4] = -481.5 -586.0 -1056.8
    [figures] torchrl, seeds 0 1 2, --total-frames 1000 --dataset <offline_dataset --seed 0 --agent-frames 0 3000 5000 --total-frames 60000>/dataset: return_at_target[-1221.8] = -860.1 -1104.1 -1128.0
    [figures] torchrl, seeds 0 1 2, --total-frames 1000 --dataset <offline_dataset --seed 0 --agent-frames 0 3000 5000 --total-frames 60000>/dataset: return_at_target[-860.9] = -843.6 -1074.2 -1121.0
    [figures] torchrl, seeds 0 1 2, --total-frames 1000 --dataset <offline_dataset --seed 0 --agent-frames 0 3000 5000 --total-frames 60000>/dataset: return_at_target[-145.4] = -481.5 -586.0 -1056.8
    [figures] rlloss, seeds 2, --total-frames 2000 --dataset <offline_dataset --seed 0 --agent-frames 0 3000 5000 --total-frames 60000>/dataset: return_at_target[-1221.8] = -1168.1
    [figures] rlloss, seeds 2, --total-frames 2000 --dataset <offline_dataset --seed 0 --agent-frames 0 3000 5000 --total-frames 60000>/dataset: return_at_target[-860.9] = -1111.4
    [figures] rlloss, seeds 2, --total-frames 2000 --dataset <offline_dataset --seed 0 --agent-frames 0 3000 5000 --total-frames 60000>/dataset: return_at_target[-145.4] = -866.5

Run:
    python tutorials/offline_dataset.py --agent-frames 0 3000 5000 --total-frames 60000 \
        --out runs/pendulum_mixed  # once
    python tutorials/dt_offline.py --seed 0 --dataset runs/pendulum_mixed/dataset

It writes ``OUT/returns.csv`` (the evaluation return every ``--eval-every`` gradient steps) and
``OUT/curve.png``, and prints ``target_return=``, ``return_at_target[<prompt>]=`` for each of
``--eval-targets``, ``train_return=`` (mean of the last 10 evaluations), ``eval_return=`` and
last ``final_return=`` (the final policy's mean over ``--eval-episodes`` fresh episodes, each
prompted with the target return).
"""

import json
from pathlib import Path

import _helpers as helpers  # tutorials/_helpers.py: flags, evaluation, plots
import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.data import Bounded, LazyMemmapStorage, TensorDictReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import (
    DecisionTransformerInferenceWrapper,
    DTActor,
    ProbabilisticActor,
    TanhDelta,
)
from tqdm import tqdm

from rlloss import DTLoss

ENV_ID = "Pendulum-v1"
parser = helpers.offline_parser(__doc__, "runs/dt_offline")
parser.add_argument("--target-return", type=float, default=None,
                    help="the return the actor is prompted with (default: the dataset's mean; "
                         "on a mixed dataset the best behaviour policy's mean)")
parser.add_argument("--eval-targets", type=float, nargs="*", default=None,
                    help="target returns the final policy is also prompted with, each on the "
                         "same start states (default: on a mixed dataset each behaviour "
                         "policy's mean return)")
parser.set_defaults(total_frames=1_000, eval_every=500)  # an expert dataset is learnt quickly
args = parser.parse_args()
device, start_time = helpers.start(args)  # seeds network init, dropout and minibatch sampling
# Pendulum-v1's action bounds as a TorchRL spec, its observation and action dims (the environment
# only evaluates: the agent learns from the dataset alone).
env = gym.make(ENV_ID)
action_spec = Bounded(low=torch.as_tensor(env.action_space.low),
                      high=torch.as_tensor(env.action_space.high),
                      shape=env.action_space.shape, device=device)
obs_dim, action_dim = env.observation_space.shape[0], action_spec.shape[-1]

# offline_dataset.py steps NUM_ENVS environments together; Pendulum's episodes last EPISODE_LEN.
NUM_ENVS, EPISODE_LEN, RETURN_SCALE = 10, 200, 100.0
BATCH_SIZE, CONTEXT, LR, WEIGHT_DECAY = 64, 20, 3e-4, 1e-4
TRANSFORMER = dict(n_embd=64, n_layer=2, n_head=1, n_inner=256, activation="relu",
                   n_positions=1024, resid_pdrop=0.1, attn_pdrop=0.1)  # a small GPT-2


class OfflineDataset:
    """The transitions of ``offline_dataset.py`` (a TorchRL ``LazyMemmapStorage`` read back with
    ``loads``), held in memory with their observations standardised by the dataset's mean and std
    (TD3+BC's normalisation, Fujimoto & Gu, arXiv:2106.06860, section 5); ``standardise`` does
    the same to an environment's observation."""

    def __init__(self, path: Path, device: torch.device, batch_size: int) -> None:
        if not (path / "storage").exists():
            raise SystemExit(f"no dataset at {path}: run tutorials/offline_dataset.py first "
                             f"(its --out/dataset), or pass --dataset.")
        size = json.loads((path.parent / "dataset.json").read_text())["transitions"]
        buffer = TensorDictReplayBuffer(storage=LazyMemmapStorage(size), batch_size=batch_size)
        buffer.loads(path)
        data = buffer.storage[:].to(device).clone()  # 50k small transitions: held in memory
        self.mean = data["observation"].mean(0)
        self.std = data["observation"].std(0) + 1e-3
        for key in ("observation", ("next", "observation")):
            data[key] = (data[key] - self.mean) / self.std
        self.data, self.device, self.batch_size = data, device, batch_size

    def sample(self) -> TensorDict:
        """A minibatch of ``batch_size`` transitions drawn uniformly with replacement."""
        index = torch.randint(len(self.data), (self.batch_size,), device=self.device)
        return self.data[index]

    def standardise(self, observation) -> torch.Tensor:
        obs = torch.as_tensor(observation, dtype=torch.float32, device=self.device)
        return (obs - self.mean) / self.std


# ---- 1. The dataset's episodes [E, EPISODE_LEN] and their returns-to-go ----
dataset = OfflineDataset(args.dataset, device, BATCH_SIZE)  # observations standardised
episodes = (dataset.data.reshape(-1, NUM_ENVS).transpose(0, 1)
            .reshape(NUM_ENVS, -1, EPISODE_LEN).reshape(-1, EPISODE_LEN))
done = episodes["next", "done"].squeeze(-1)
if not (done[:, -1].all() and not done[:, :-1].any()):
    raise SystemExit(f"{args.dataset}: not {NUM_ENVS} environments of {EPISODE_LEN}-step "
                     "episodes stepped together (offline_dataset.py's layout)")
reward = episodes["next", "reward"]
episodes["return_to_go"] = reward.flip(1).cumsum(1).flip(1) / RETURN_SCALE
summary = json.loads((args.dataset.parent / "dataset.json").read_text())
policy_returns = [policy["mean_return"] for policy in summary.get("policies", [])]
mixed = len(policy_returns) > 1  # offline_dataset.py --agent-frames with several policies
target_return = args.target_return
if target_return is None:
    target_return = max(policy_returns) if mixed else summary["mean_return"]
eval_targets = args.eval_targets
if eval_targets is None:
    eval_targets = sorted(policy_returns) if mixed else []


def sample_windows() -> TensorDict:
    """BATCH_SIZE windows of CONTEXT consecutive steps of random episodes, ``[B, CONTEXT]``."""
    episode = torch.randint(len(episodes), (BATCH_SIZE, 1), device=device)
    first = torch.randint(EPISODE_LEN - CONTEXT + 1, (BATCH_SIZE, 1), device=device)
    steps = first + torch.arange(CONTEXT, device=device)
    return episodes[episode, steps].select("observation", "action", "return_to_go")


# ---- 2. TorchRL's Decision Transformer actor; 3. rlloss's DTLoss ----
actor = ProbabilisticActor(
    TensorDictModule(DTActor(obs_dim, action_dim, transformer_config=TRANSFORMER),
                     in_keys=["observation", "action", "return_to_go"], out_keys=["param"]),
    in_keys=["param"], out_keys=["action"], distribution_class=TanhDelta,
    distribution_kwargs={"low": action_spec.space.low, "high": action_spec.space.high},
    default_interaction_type=ExplorationType.DETERMINISTIC,
).to(device)
loss_module = DTLoss(actor, loss_function="l2")
optimizer = torch.optim.AdamW(loss_module.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
inference_actor = DecisionTransformerInferenceWrapper(actor, inference_context=CONTEXT)


# ---- 4. Playing episodes prompted with a target return ----
@torch.no_grad()
def evaluate(episodes: int, seed: int, target: float | None = None) -> list[float]:
    """Returns of ``episodes`` episodes prompted with ``target`` (default: the target return) on
    start states seeded ``seed, seed + 1, ...``, played side by side (one batched transformer
    call a step; Pendulum's episodes all end at its 200-step limit). The window holds the last
    CONTEXT (R_t, s_t) and the actions before them (a zero before the first, which the wrapper
    shifts out)."""
    envs = [gym.make(ENV_ID) for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    target = target_return if target is None else target
    observations = [dataset.standardise(obs)]  # each [episodes, obs_dim]
    actions = [torch.zeros(episodes, action_dim, device=device)]
    returns_to_go = [torch.full((episodes, 1), target / RETURN_SCALE, device=device)]
    episode_returns, finished = np.zeros(episodes), False
    while not finished:
        window = TensorDict(observation=torch.stack(observations[-CONTEXT:], 1),
                            action=torch.stack(actions[-CONTEXT:], 1),
                            return_to_go=torch.stack(returns_to_go[-CONTEXT:], 1),
                            batch_size=[episodes])
        actor.eval()  # no dropout while playing
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            action = inference_actor(window)["action"]  # [episodes, action_dim]
        actor.train()
        steps = [env.step(a) for env, a in zip(envs, action.cpu().numpy(), strict=True)]
        reward = np.array([step[1] for step in steps], dtype=np.float32)
        episode_returns += reward
        finished = all(step[2] or step[3] for step in steps)
        observations.append(dataset.standardise(np.stack([step[0] for step in steps])))
        actions.append(action)
        returns_to_go.append(returns_to_go[-1]
                             - torch.as_tensor(reward, device=device)[:, None] / RETURN_SCALE)
    for env in envs:
        env.close()
    return episode_returns.tolist()


# ---- Training: minibatches of windows; every --eval-every steps 5 prompted episodes ----
curve = []  # (gradient steps, mean return of 5 prompted episodes)
pbar = tqdm(total=args.total_frames, unit="steps")
for step in range(1, args.total_frames + 1):
    loss = loss_module(sample_windows())["loss"]
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(loss_module.parameters(), 0.25)  # the paper's clipping
    optimizer.step()
    if step % args.eval_every == 0 or step == args.total_frames:
        curve.append((step, float(np.mean(evaluate(5, 20_000 + 100 * args.seed + step)))))
        pbar.set_postfix(eval_return=f"{curve[-1][1]:.1f}")
    pbar.update(1)
pbar.close()

# ---- Save the evaluations' curve, evaluate the final policy on start states the dataset never
# saw (prompted with the target return), report ----
helpers.save_learning_curve(args.out, curve, f"Decision Transformer on a fixed Pendulum-v1 "
                            f"dataset (target {target_return:.0f})", window=5,
                            xlabel="gradient steps", ylabel="evaluation return (5 episodes)")
print(f"target_return={target_return:.1f}")
final_seed = 10_000 + 100 * args.seed
prompted = {target: evaluate(args.eval_episodes, final_seed, target)
            for target in [*eval_targets, target_return]}  # the same start states, each prompt
for target in eval_targets:  # the return conditioning
    print(f"return_at_target[{target:.1f}]={np.mean(prompted[target]):.1f}")
helpers.report(start_time, curve, prompted[target_return])
