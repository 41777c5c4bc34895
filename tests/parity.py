"""The parity check shared by the tests of losses that draw random numbers: rlloss's and
TorchRL's loss on copies of the same networks, called on copies of one batch with the same
seed, give the same outputs and the same gradients."""

from __future__ import annotations

import torch


def assert_same_seeded(ours, theirs, batch, seed: int = 1) -> None:
    """Every output entry, and every parameter's gradient of the sum of the ``loss*`` entries
    (parameters paired in registration order), equal."""
    torch.manual_seed(seed)
    out_ours = ours(batch.clone())
    torch.manual_seed(seed)
    out_theirs = theirs(batch.clone())
    assert set(out_ours.keys()) == set(out_theirs.keys())
    for key in out_ours.keys():
        torch.testing.assert_close(out_ours[key], out_theirs[key], msg=key)
    for out in (out_ours, out_theirs):
        sum(v.sum() for k, v in out.items() if k.startswith("loss")).backward()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)
