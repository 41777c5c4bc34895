"""What the on-policy losses (:class:`rlloss.onpolicy.OnPolicyLoss`) need of their networks: the
critic's coefficient, the keys the actor declares, the critic's parameters cut from the actor's
under ``separate_losses``, the actor trunk's features a critic head reads, the error for a
missing old value (value clipping), and PPO-EWMA's frozen copy of the actor.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase, TensorDictParams
from tensordict.utils import NestedKey
from torch import nn

from rlloss._checks import MissingKeyError, check_network
from rlloss._ensembles import FrozenPolicy
from rlloss._networks import entry


def critic_coefficient(
    owner: str, actor_network: nn.Module, critic_network: nn.Module | None, critic_coeff
) -> float | None:
    """The critic's coefficient, 1.0 by default with a critic; refuses what is not a network
    and a coefficient without a critic (``TypeError``)."""
    check_network(owner, "actor_network", actor_network)
    if critic_network is not None:
        check_network(owner, "critic_network", critic_network)
    if critic_coeff is None and critic_network is not None:
        return 1.0
    if critic_network is None and critic_coeff not in (None, 0, 0.0):
        raise TypeError(f"{owner}: critic_coeff={critic_coeff} needs a critic_network.")
    return critic_coeff


def declared_actor_keys(actor_network: nn.Module) -> dict[str, NestedKey | list[NestedKey]]:
    """The log-prob and action keys the actor declares (TorchRL's ``log_prob_keys`` and
    ``dist_sample_keys``), by the name of the accepted key they set; a list for several heads
    (TorchRL keeps the list), one key for one."""
    declared = {}
    for name, attr in (("sample_log_prob", "log_prob_keys"), ("action", "dist_sample_keys")):
        keys = getattr(actor_network, attr, None)
        if keys:
            declared[name] = list(keys) if len(keys) > 1 else keys[0]
    return declared


def critic_params_detached_from_actor(
    actor_network: nn.Module, critic_network: nn.Module
) -> TensorDict | None:
    """The critic's parameters with those it shares with the actor replaced by detached views
    (same storage), or ``None`` when nothing is shared."""
    actor_params = {id(p) for p in actor_network.parameters()}
    params = TensorDict.from_module(critic_network)
    shared = [k for k, p in params.items(True, True) if id(p) in actor_params]
    if not shared:
        return None
    for key in shared:
        params.set(key, params.get(key).detach())
    return params


def lacks_any(batch: TensorDictBase, keys: list) -> bool:
    """Whether ``batch`` lacks one of ``keys`` (the critic's inputs: a critic head on the actor's
    trunk reads features the batch does not hold)."""
    for key in keys:  # a loop: no generator frame per call
        if entry(batch, key) is None:
            return True
    return False


def with_actor_features(
    batch: TensorDictBase, actor_network: nn.Module, detach: bool
) -> TensorDictBase:
    """A shallow copy of the batch with the actor trunk's outputs added (TorchRL's actor call
    leaves them in the batch, where a critic head on the trunk reads them); ``detach``
    (``separate_losses``) computes them without a graph."""
    batch = batch.copy()
    with torch.set_grad_enabled(torch.is_grad_enabled() and not detach):
        actor_network.get_dist(batch)  # writes the trunk's outputs, samples nothing
    return batch


def missing_old_value_error(
    owner: str, clip_value: torch.Tensor, key: NestedKey, hint: str
) -> MissingKeyError:
    """TorchRL's error for value clipping without ``V_old(s)``, the critic's value stored at
    collection under ``key`` (``hint``: TorchRL's name of the key, per family)."""
    clip = float(clip_value)  # an error path: reading the buffer is fine
    return MissingKeyError(
        f"{owner}: clip_value is set to {clip}, but the key {key} was not found in the input "
        f"tensordict. Make sure that {hint} exists in the input tensordict (store V(s) at "
        "collection, or rename it with loss.set_keys(value=...))."
    )


def proximal_policy(
    actor_network: nn.Module, functional: bool
) -> tuple[FrozenPolicy, TensorDictParams]:
    """A frozen copy of the actor and its parameters, to register as
    ``target_actor_network_params`` (moved by TorchRL's ``SoftUpdate`` / ``HardUpdate``): the
    proximal policy of PPO-EWMA (Hilton et al., arXiv:2110.00641). TorchRL's refusal without
    ``functional``."""
    if not functional:
        raise ValueError(
            "delay_actor=True requires functional=True: the proximal policy is held in "
            "target_actor_network_params, which only exists for functionalized modules."
        )
    proximal = FrozenPolicy(actor_network)
    tensors = TensorDict.from_module(proximal.module)
    return proximal, TensorDictParams(tensors, no_convert=True)
