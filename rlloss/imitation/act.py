"""``ACTLoss``: Action Chunking with Transformers (Zhao et al., "Learning Fine-Grained Bimanual
Manipulation with Low-Cost Hardware", arXiv:2304.13705): the chunk's L1 reconstruction and the
CVAE's KL."""

from __future__ import annotations

import dataclasses

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data.vla import ACTION_CHUNK_KEY

from rlloss import functional as rlf
from rlloss._checks import Coefficient
from rlloss._networks import NetworkCall
from rlloss.common import accepts_tensor_arguments
from rlloss.imitation.base import SupervisedLoss, zero_padded

# the entries the ACT policy reads, whatever the batch's keys (TorchRL's ACTModel contract)
POLICY_INPUTS = ("observation", "action_chunk")


class ACTLoss(SupervisedLoss):
    r"""ACT's loss: the CVAE policy reconstructs the demonstrated chunk of $T$ actions
    (:func:`rlloss.functional.chunk_l1`, over the chunk's valid steps with a padding mask) and
    its encoder's posterior stays near the prior (:func:`rlloss.functional.standard_normal_kl`);
    each reduced over the batch:

    $$
    \mathcal{L}_{\text{reconstruction}} = \frac{1}{T D} \sum_{t, d} |\hat{a}_{t,d} - a_{t,d}|,
    \qquad
    \mathcal{L}_{\text{kl}} = \mathrm{KL}\big(N(\mu, e^{\log \sigma^2}) \,\|\, N(0, I)\big),
    \qquad
    \mathcal{L}_{\text{act}} = \mathcal{L}_{\text{reconstruction}}
    + w_{\text{kl}} \mathcal{L}_{\text{kl}}
    $$

    ($w_{\text{kl}}$ = ``kl_weight``; the two terms reported detached).

    TorchRL's ``ACTLoss`` with the same keywords, keys and outputs. The policy reads
    ``"observation"`` and ``"action_chunk"`` (the batch's ``observation`` and ``action_chunk``
    entries are passed under these names) and writes ``action_pred`` (``[*B, T, D]``, the
    chunk's shape), ``mu`` and ``log_var`` (``[*B, Z]``).

    Keys (``set_keys``): ``observation`` (``"observation"``), ``action_chunk``
    (``("vla_action", "chunk")``), ``action_pred`` (``"action_pred"``), ``mu`` (``"mu"``),
    ``log_var`` (``"log_var"``), and rlloss's ``pad_mask`` (default ``None``): a boolean entry
    ``[*B, T]``, ``True`` on the padded steps of a chunk cut at an episode's end, left out of
    the reconstruction. The batch's ``loss_mask_key`` masks leave whole samples out.

    Reference: Zhao et al., "Learning Fine-Grained Bimanual Manipulation with Low-Cost
    Hardware", arXiv:2304.13705.

    Args:
        actor_network: the ACT policy (TorchRL's ``ACTModel`` in a ``TensorDictModule``).
        kl_weight: ``beta``, >= 0 (default 10.0, the paper's); a buffer, so a schedule does
            not recompile a compiled loss.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``[*B]``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules.models import ACTModel
        >>> from rlloss import ACTLoss
        >>> policy = ACTModel(
        ...     obs_dim=4,
        ...     action_dim=2,
        ...     chunk_size=5,
        ...     hidden_dim=16,
        ...     nheads=2,
        ...     num_encoder_layers=1,
        ...     num_decoder_layers=1,
        ...     latent_dim=4,
        ... )
        >>> loss = ACTLoss(
        ...     TensorDictModule(
        ...         policy,
        ...         ["observation", ("vla_action", "chunk")],
        ...         ["action_pred", "mu", "log_var"],
        ...     )
        ... )
        >>> chunks = TensorDict(
        ...     {
        ...         "observation": torch.randn(8, 4),
        ...         ("vla_action", "chunk"): torch.randn(8, 5, 2),
        ...     },  # the next 5 actions
        ...     [8],
        ... )
        >>> loss(chunks)["loss_act"].backward()
    """

    @dataclasses.dataclass
    class _AcceptedKeys:
        """Keys read by ACTLoss."""

        observation: NestedKey = "observation"  # the policy's input, [*B, *O]
        action_chunk: NestedKey = ACTION_CHUNK_KEY  # the demonstrated chunk [*B, T, D]
        action_pred: NestedKey = "action_pred"  # the policy's chunk, [*B, T, D]
        mu: NestedKey = "mu"  # the CVAE encoder's mean, [*B, Z]
        log_var: NestedKey = "log_var"  # the CVAE encoder's log-variance, [*B, Z]
        pad_mask: NestedKey | None = None  # True on a chunk's padded steps (rlloss's), [*B, T]

    out_keys = ["loss_act", "loss_reconstruction", "loss_kl"]
    kl_weight = Coefficient(low=0.0, buffer=True)

    def __init__(
        self, actor_network: nn.Module, *, kl_weight: float = 10.0, reduction: str = "mean"
    ) -> None:
        super().__init__(reduction)
        self._register_networks(actor_network=actor_network)
        device = next(iter(actor_network.parameters()), torch.empty(0)).device
        self._register_coefficients(device=device, kl_weight=kl_weight)
        self._actor_call = NetworkCall(actor_network)

    @property
    def in_keys(self) -> list[NestedKey]:
        keys = [self.tensor_keys.observation, self.tensor_keys.action_chunk]
        return keys if self.tensor_keys.pad_mask is None else [*keys, self.tensor_keys.pad_mask]

    @accepts_tensor_arguments
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """``{"loss_act", "loss_reconstruction", "loss_kl"}`` on a batch of observations and
        demonstrated chunks."""
        tensordict = self._without_padding(tensordict)
        chunk = self._get(tensordict, "action_chunk")
        valid = self._valid_steps(tensordict, chunk)
        if valid is not None:  # NaN/inf in padding reaches neither the policy nor a gradient
            chunk = zero_padded(chunk, ~valid, finite_only=True)
        inputs = dict(
            zip(POLICY_INPUTS, (self._get(tensordict, "observation"), chunk), strict=True)
        )
        outputs = self._actor_call.on_inputs(inputs, tensordict.batch_size)
        prediction, mu, log_var = (
            outputs[getattr(self.tensor_keys, name)] for name in ("action_pred", "mu", "log_var")
        )
        _check_chunks(prediction, chunk, self.tensor_keys)
        reconstruction = self._reduce_valid(rlf.chunk_l1(prediction, chunk, valid), tensordict)
        kl = self._reduce_valid(rlf.standard_normal_kl(mu, log_var), tensordict)
        out = {
            "loss_act": reconstruction + self.kl_weight * kl,
            "loss_reconstruction": reconstruction.detach(),
            "loss_kl": kl.detach(),
        }
        return TensorDict(out, batch_size=[])

    def _valid_steps(self, tensordict: TensorDictBase, chunk: torch.Tensor):
        """``~pad_mask`` (``[*B, T]``) when the key is set and the batch holds it."""
        key = self.tensor_keys.pad_mask
        pad = None if key is None else tensordict.get(key, None)
        return None if pad is None else ~pad


def _check_chunks(prediction: torch.Tensor, chunk: torch.Tensor, keys) -> None:
    """The policy's chunks have the demonstrations' shape (a shape check: no host sync)."""
    if prediction.shape != chunk.shape:
        raise ValueError(
            f"ACTLoss: the policy predicts chunks {keys.action_pred!r} of shape "
            f"{tuple(prediction.shape)} but the demonstrated chunks {keys.action_chunk!r} have "
            f"shape {tuple(chunk.shape)} ([*B, chunk length, action dim]): build the policy "
            "with the dataset's chunk length (ACTModel(chunk_size=...)) and action size."
        )
