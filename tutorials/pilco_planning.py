"""Planning with PILCO's expected saturating cost (rlloss's ``ExponentialQuadraticCost``).

PILCO (Deisenroth and Rasmussen, ICML 2011) scores a policy by the expected cost of the Gaussian
state distributions its model predicts, with a saturating cost
c(x) = 1 - exp(-(x - t)^T W (x - t) / 2) whose expectation under N(m, S) has a closed form
(eq. 24-25): ``ExponentialQuadraticCost`` computes it, differentiably in m and S. This example
uses it to plan, on a task small enough to read in one go:

1. a point mass in the plane (x = position, velocity; acceleration in [-1, 1]^2, dt = 0.1 s,
   process noise) must go from (-2, 1) at rest to the origin and stay there, in 50 steps;
2. a linear-Gaussian model x' = A x + B u + w, w ~ N(0, Q), is fitted by least squares to
   ``--total-frames`` transitions of random states and actions (PILCO fits a Gaussian process;
   a linear model keeps the moments exact: m' = A m + B u, S' = A S A^T + Q);
3. the planner minimises the summed expected cost of the predicted states by gradient descent
   (Adam) on an open-loop action sequence u_t = tanh(theta_t), through the moment propagation;
4. the plan is executed on the true system open loop, and in receding horizon: at each step the
   remaining plan is re-optimised (20 Adam steps, warm-started) from the observed state, and its
   first action taken.

A step's reward is minus the saturating cost of the state it reaches (cost width 1 on the
position, 2 on the velocity), so a return is in [-50, 0]; the start is 2.2 away, so the first
steps cost close to 1 whatever the plan.

Results (500 fitted transitions, 10 executed episodes; seeds 0, 1, 2): largest error of the
fitted A, B coefficients 0.0019, 0.0023, 0.0021; the planned expected cost (summed over the 50
steps) goes from 45.5, 45.3, 45.7 (no action) to 16.5, 16.3, 16.5 in 300 Adam steps. Receding horizon: return -13.5, -13.2, -13.2, final distance
to the target 0.035, 0.028, 0.033. The open-loop plan: -16.5, -16.0, -16.1, final distance
0.55, 0.58, 0.61 (the process noise on the velocity accumulates with nothing to correct it).
Uniformly random actions: -45.2, -44.7, -44.2. With TorchRL's ``ExponentialQuadraticCost``
swapped in (``tools/tutorial_runs.py``): the same figures to the printed digits,
all three seeds (one CPU thread).

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --total-frames 500: model_error = 0.0019 0.0023 0.0021
    [figures] rlloss, seeds 0 1 2, --total-frames 500: planned_expected_cost = 16.5 16.3 16.5
    [figures] rlloss, seeds 0 1 2, --total-frames 500: final_return = -13.5 -13.2 -13.2
    [figures] rlloss, seeds 0 1 2, --total-frames 500: final_distance = 0.035 0.028 0.033
    [figures] rlloss, seeds 0 1 2, --total-frames 500: open_loop_return = -16.5 -16.0 -16.1
    [figures] rlloss, seeds 0 1 2, --total-frames 500: open_loop_distance = 0.55 0.58 0.61
    [figures] rlloss, seeds 0 1 2, --total-frames 500: random_return = -45.2 -44.7 -44.2
    [figures] torchrl, seeds 0 1 2, --total-frames 500: model_error = 0.0019 0.0023 0.0021
    [figures] torchrl, seeds 0 1 2, --total-frames 500: planned_expected_cost = 16.5 16.3 16.5
    [figures] torchrl, seeds 0 1 2, --total-frames 500: final_return = -13.5 -13.2 -13.2
    [figures] torchrl, seeds 0 1 2, --total-frames 500: final_distance = 0.035 0.028 0.033
    [figures] torchrl, seeds 0 1 2, --total-frames 500: open_loop_return = -16.5 -16.0 -16.1
    [figures] torchrl, seeds 0 1 2, --total-frames 500: open_loop_distance = 0.55 0.58 0.61
    [figures] torchrl, seeds 0 1 2, --total-frames 500: random_return = -45.2 -44.7 -44.2

Run:
    python tutorials/pilco_planning.py --seed 0 --total-frames 500 --out runs/pilco_planning

It writes ``OUT/returns.csv`` (one row per executed episode: the real transitions the model was
fitted on, the episode's return), ``OUT/plan_costs.csv`` (the planned expected cost per planner
iteration) and ``OUT/curve.png`` (the executed paths and the planned mean, the planner's cost);
it prints ``model_error=`` (the fitted model's largest coefficient error), ``random_return=``,
``final_distance=`` (mean distance to the target at the end of the executed episodes) and last
``final_return=`` (their mean return).
"""

import _helpers as helpers  # tutorials/_helpers.py: the plumbing
import torch
from matplotlib.figure import Figure
from tensordict import TensorDict

from rlloss import ExponentialQuadraticCost

parser = helpers.tutorial_parser(__doc__, "runs/pilco_planning", 500,
                                 frames_help="random transitions the model is fitted on")
parser.add_argument("--episodes", type=int, default=10, help="executed episodes of the plan")
parser.add_argument("--iterations", type=int, default=300, help="planner steps")
args = parser.parse_args()
device, start_time = helpers.start(args)

# ---- The system: a point mass in the plane, x = (position, velocity) in R^4, acceleration
# u in [-1, 1]^2, dt = 0.1 s: x' = A x + B u + w, w ~ N(0, Q). The task: from (-2, 1) at rest,
# reach the origin and stay there, in HORIZON steps.
DT, HORIZON = 0.1, 50
A_TRUE = torch.eye(4) + DT * torch.diag(torch.ones(2), 2)  # p' = p + dt v
B_TRUE = torch.cat([0.5 * DT**2 * torch.eye(2), DT * torch.eye(2)])  # v' = v + dt u
NOISE = torch.tensor([0.01, 0.01, 0.02, 0.02])  # process noise standard deviations
START_MEAN, START_STD = torch.tensor([-2.0, 1.0, 0.0, 0.0]), 0.05
TARGET = torch.zeros(4)
# The cost's width: 1 on the position, 2 on the velocity (W = diag(1, 1, 1/4, 1/4)).
WEIGHTS = torch.diag(torch.tensor([1.0, 1.0, 0.25, 0.25]))


def true_step(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return x @ A_TRUE.T + u @ B_TRUE.T + NOISE * torch.randn_like(x)


# ---- 1. Fit a linear-Gaussian model x' = A x + B u + w from random transitions (least squares
# on [x, u], the residuals' covariance as Q).
x = START_MEAN + torch.randn(args.total_frames, 4) * torch.tensor([2.0, 2.0, 1.0, 1.0])
u = torch.rand(args.total_frames, 2) * 2 - 1
x_next = true_step(x, u)
inputs = torch.cat([x, u], dim=-1)
coefficients = torch.linalg.lstsq(inputs, x_next).solution  # [6, 4]: [A B]^T
residuals = x_next - inputs @ coefficients
A, B = coefficients[:4].T, coefficients[4:].T
Q = residuals.T @ residuals / (args.total_frames - inputs.shape[-1])
model_error = max((A - A_TRUE).abs().max().item(), (B - B_TRUE).abs().max().item())


# ---- 2. Moment propagation: a Gaussian state N(m, S) through the model stays Gaussian,
# m' = A m + B u, S' = A S A^T + Q (the actions are an open-loop plan, so S does not depend on
# them; PILCO's general case propagates a GP model's moments instead).
def propagate(mean: torch.Tensor, covariance: torch.Tensor, actions: torch.Tensor):
    """The state means [E, H, 4] and covariances [H, 4, 4] after each action of ``actions``
    [E, H, 2], from N(mean [E, 4], covariance [4, 4])."""
    means, covariances = [], []
    for action in actions.unbind(1):
        mean = mean @ A.T + action @ B.T
        covariance = A @ covariance @ A.T + Q
        means.append(mean)
        covariances.append(covariance)
    return torch.stack(means, 1), torch.stack(covariances)


# ---- 3. Plan: the expected cost E[1 - exp(-(x - t)^T W (x - t) / 2)] of each predicted state,
# in closed form (ExponentialQuadraticCost, summed over the horizon and the episodes), minimised
# by gradient descent on an open-loop action sequence u_t = tanh(theta_t).
cost = ExponentialQuadraticCost(target=TARGET, weights=WEIGHTS, reduction="sum")


def plan(mean, covariance, theta: torch.Tensor, iterations: int) -> list[float]:
    """``iterations`` Adam steps on ``theta`` [E, H, 2] (in place); the expected costs."""
    theta.requires_grad_(True)
    optimizer = torch.optim.Adam([theta], lr=0.1)
    costs = []
    for _ in range(iterations):
        means, covariances = propagate(mean, covariance, torch.tanh(theta))
        states = TensorDict({("observation", "mean"): means,
                             ("observation", "var"): covariances.expand(len(mean), -1, -1, -1)},
                            batch_size=means.shape[:2])
        expected_cost = cost(states)["loss_cost"]
        optimizer.zero_grad()
        expected_cost.backward()
        optimizer.step()
        costs.append(expected_cost.item() / len(mean))
    theta.requires_grad_(False)
    return costs


def step_costs(paths: torch.Tensor) -> torch.Tensor:
    """The saturating cost 1 - exp(-(x - t)^T W (x - t) / 2) of each state of ``paths``."""
    offset = paths - TARGET
    return 1 - torch.exp(-0.5 * torch.einsum("...i,ij,...j->...", offset, WEIGHTS, offset))


# ---- 4. Execute on the true (noisy) system, --episodes at once; the reward of a step is minus
# the saturating cost of the state it reaches, so a return is in [-HORIZON, 0]. Open loop: the
# whole plan from the start state's distribution. Receding horizon (model-predictive control):
# at each step, from the observed state (S = 0), re-plan the remaining steps, warm-started from
# the previous plan, for REPLAN iterations, and take its first action.
REPLAN = 20


def execute(actions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Paths [E, H + 1, 4] and returns [E] of the plan ``actions`` [E, H, 2], or of receding
    horizon control from the open-loop plan (``None``)."""
    x = START_MEAN + START_STD * torch.randn(args.episodes, 4)
    theta = torch.atanh(open_loop.clamp(-0.999, 0.999)).expand(args.episodes, -1, -1).clone()
    paths = [x]
    for t in range(HORIZON):
        if actions is None:
            plan(x, torch.zeros(4, 4), theta[:, t:], REPLAN)
        x = true_step(x, torch.tanh(theta[:, t]) if actions is None else actions[:, t])
        paths.append(x)
    paths = torch.stack(paths, dim=1)
    return paths, -step_costs(paths[:, 1:]).sum(-1)


theta = torch.zeros(1, HORIZON, 2)
plan_costs = plan(START_MEAN[None], START_STD**2 * torch.eye(4), theta, args.iterations)
open_loop = torch.tanh(theta[0])
paths, returns = execute(None)
open_paths, open_returns = execute(open_loop.expand(args.episodes, -1, -1))
_, random_returns = execute(torch.rand(args.episodes, HORIZON, 2) * 2 - 1)
final_distance = paths[:, -1, :2].norm(dim=-1).mean().item()
open_loop_distance = open_paths[:, -1, :2].norm(dim=-1).mean().item()

# ---- Results: the CSVs, the figure, the report.
helpers.write_csv(args.out / "returns.csv", ["frames", "episode_return"],
                  [(args.total_frames, r) for r in returns.tolist()])
helpers.write_csv(args.out / "plan_costs.csv", ["iteration", "expected_cost"],
                  enumerate(plan_costs))
fig = Figure(figsize=(10, 4))
ax_paths, ax_cost = fig.subplots(1, 2)
for i, (path, open_path) in enumerate(zip(paths, open_paths, strict=True)):
    ax_paths.plot(*open_path[:, :2].T, color="tab:orange", alpha=0.4,
                  label="open loop" if i == 0 else None)
    ax_paths.plot(*path[:, :2].T, color="tab:blue", alpha=0.4,
                  label="receding horizon" if i == 0 else None)
planned = propagate(START_MEAN[None], START_STD**2 * torch.eye(4), open_loop[None])[0][0]
ax_paths.plot(*planned[:, :2].T, "k--", label="planned mean")
ax_paths.plot(0, 0, "r*", markersize=12, label="target")
ax_paths.set(xlabel="x", ylabel="y", title="executed paths")
ax_paths.legend()
ax_cost.plot(plan_costs)
ax_cost.set(xlabel="planner iteration", ylabel="expected cost (sum over the horizon)")
fig.savefig(args.out / "curve.png", dpi=100, bbox_inches="tight")
print(f"model_error={model_error:.4f}")
print(f"planned_expected_cost={plan_costs[-1]:.2f} (first {plan_costs[0]:.2f})")
print(f"random_return={random_returns.mean().item():.2f}")
print(f"open_loop_return={open_returns.mean().item():.2f}")
print(f"open_loop_distance={open_loop_distance:.3f}")
print(f"final_distance={final_distance:.3f}")
helpers.report(start_time, [(args.total_frames, r) for r in returns.tolist()])
