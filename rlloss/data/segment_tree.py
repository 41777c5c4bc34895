"""Sum, min and max segment trees in one flat tensor, searched and updated a batch at a time.

The trees of a :class:`~rlloss.data.PrioritizedSampler` are the rows of one ``[3, 2 C]`` float64
tensor, ``C`` the capacity rounded up to a power of two. In each row node ``k`` has the children
``2 k`` and ``2 k + 1``, the root is node 1 and leaf ``i`` is node ``C + i`` (node 0 is unused):

- row ``SUM``: the sum of its leaves (the sampling masses ``(p + eps) ** alpha``; 0 when empty),
- row ``MIN``: the smallest of the same masses (``+inf`` when empty),
- row ``MAX``: the largest raw priority ``p`` (``-inf`` when empty).

Every function works on a whole batch of leaves at once: a batched update writes the leaves and
recomputes their ancestors one level at a time, a batched search descends all samples together,
so both cost ``log2(C)`` rounds of tensor operations, with no Python loop over samples and no
value read back to the host. Each parent is recomputed from its children (never incremented), so
the sums do not drift however many updates they see.
"""

from __future__ import annotations

import torch

SUM, MIN, MAX = 0, 1, 2
EMPTY = (0.0, float("inf"), float("-inf"))  # the neutral element of each row


def tree_capacity(size: int) -> int:
    """The number of leaves of a tree holding ``size`` entries: ``size`` rounded up to a power
    of two."""
    return 1 << max(size - 1, 0).bit_length()


def empty_trees(size: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The ``[3, 2 C]`` float64 trees of ``size`` empty entries (every node neutral)."""
    nodes = 2 * tree_capacity(size)
    return torch.tensor(EMPTY, dtype=torch.float64, device=device).unsqueeze(-1).repeat(1, nodes)


def leaves(trees: torch.Tensor) -> torch.Tensor:
    """The ``[3, C]`` leaf rows of ``trees`` (a view: writing them and calling :func:`rebuild`
    updates the trees)."""
    return trees[:, trees.shape[-1] // 2 :]


def combine_children(children: torch.Tensor) -> torch.Tensor:
    """Parents from their child pairs: ``children`` is ``[3, *B, 2]``; returns ``[3, *B]`` (the
    sum, the min and the max of each pair, one row each)."""
    return torch.stack((children[SUM].sum(-1), children[MIN].amin(-1), children[MAX].amax(-1)))


def write_leaves(trees: torch.Tensor, leaf: torch.Tensor, values: torch.Tensor) -> None:
    """Write ``values`` (``[3, B]``) at the leaves ``leaf`` (``[B]``, int64) of ``trees``, in
    place, and recompute their ancestors bottom-up.

    A leaf that appears several times in ``leaf`` must be given the same values each time (see
    :func:`last_write_wins`): then every write of a node stores the same number, and the result
    does not depend on the order the writes happen in."""
    capacity = trees.shape[-1] // 2
    node = leaf + capacity
    trees[:, node] = values
    pairs = trees.view(3, capacity, 2)  # row n holds the children 2 n, 2 n + 1 of node n
    for _ in range(capacity.bit_length() - 1):  # log2(C) levels
        node = node // 2
        trees[:, node] = combine_children(pairs[:, node])


def rebuild(trees: torch.Tensor) -> None:
    """Recompute every internal node of ``trees`` from the leaves, in place (O(C))."""
    width = trees.shape[-1] // 4  # the number of parents of the leaves
    while width >= 1:
        children = trees[:, 2 * width : 4 * width].unflatten(-1, (width, 2))
        trees[:, width : 2 * width] = combine_children(children)
        width //= 2


def last_write_wins(leaf: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """For each entry of ``leaf`` (``[B]``), the position in the batch of the last entry that
    writes the same leaf with ``keep`` true, or ``-1`` where no such entry exists.

    This turns a batch with repeated leaves into one where every repeat carries the same value,
    the one written last (as a sequential loop of writes would leave it)."""
    batch = leaf.shape[0]
    position = torch.arange(batch, device=leaf.device)
    # sort by leaf, then by position among the kept entries; dropped entries come first
    key = leaf * (batch + 1) + torch.where(keep, position + 1, 0)
    sorted_key, order = torch.sort(key)
    last = torch.searchsorted(sorted_key, leaf * (batch + 1) + batch, right=True) - 1
    winner = order[last]
    return torch.where(keep[winner], winner, -1)


def prefix_search(sums: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """The leaf ``i`` of the sum tree ``sums`` (``[2 C]``) whose interval
    ``[S_{i-1}, S_i)`` of the running sum ``S_i = sum_{j <= i} leaf_j`` contains each ``mass``
    (``[B]``, float64, in ``[0, S_{C-1})``).

    All masses descend the tree together, one level per round. A child whose sum is 0 is never
    entered, so an empty leaf is never returned (even when rounding puts a mass at the very end
    of the total), as long as the total is positive."""
    capacity = sums.shape[-1] // 2
    pairs = sums.view(capacity, 2)  # row n holds the children 2 n, 2 n + 1 of node n
    node = torch.ones_like(mass, dtype=torch.long)
    for _ in range(capacity.bit_length() - 1):
        children = pairs[node]
        left = children[:, 0]
        go_right = (mass >= left) & (children[:, 1] > 0.0)
        mass = torch.where(go_right, mass - left, mass)
        node = 2 * node + go_right
    return node - capacity
