"""The functional core: one pure tensor function per paper quantity.

Tensors in, per-element tensors out (reductions live in :mod:`rlloss.functional.reduce`); no
``nn.Module``, no TensorDict, no in-place writes to inputs.
"""

from rlloss.functional.critic import clipped_value_loss, distance
from rlloss.functional.distributions import (
    squash,
    squash_log_abs_det_jacobian,
    tanh_normal_log_prob,
    tanh_normal_sample_and_log_prob,
)
from rlloss.functional.policy import (
    categorical_kl,
    clip_bounds,
    clipped,
    clipped_surrogate,
    distribution_entropy,
    gaussian_kl,
    has_analytic_entropy,
    kl_divergence,
    kl_k3,
    log_ratio,
    rpo_perturbation,
)
from rlloss.functional.q import (
    chosen_action_value,
    clipped_double_q_value,
    discrete_soft_value,
    double_q_value,
    greedy_value,
    smoothed_target_action,
    soft_value,
    temperature_loss,
)
from rlloss.functional.reduce import (
    explained_variance,
    normalized_effective_sample_size,
    reduce,
    standardize,
)
from rlloss.functional.returns import (
    bootstrap_discount,
    discounted_returns,
    gae_advantage,
    reverse_discounted_sum,
    td0_error,
    td0_return,
    td_lambda_return,
)

__all__ = [
    "bootstrap_discount",
    "categorical_kl",
    "chosen_action_value",
    "clip_bounds",
    "clipped",
    "clipped_double_q_value",
    "clipped_surrogate",
    "clipped_value_loss",
    "discounted_returns",
    "discrete_soft_value",
    "distance",
    "distribution_entropy",
    "double_q_value",
    "explained_variance",
    "gae_advantage",
    "gaussian_kl",
    "greedy_value",
    "has_analytic_entropy",
    "kl_divergence",
    "kl_k3",
    "log_ratio",
    "normalized_effective_sample_size",
    "reduce",
    "reverse_discounted_sum",
    "rpo_perturbation",
    "smoothed_target_action",
    "soft_value",
    "squash",
    "squash_log_abs_det_jacobian",
    "standardize",
    "tanh_normal_log_prob",
    "tanh_normal_sample_and_log_prob",
    "td0_error",
    "td0_return",
    "td_lambda_return",
    "temperature_loss",
]
