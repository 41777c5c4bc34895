"""The class tree of the losses stays flat (issue 48): at most two private bases between a public
loss and ``LossModule``, and every private base shared by at least two public losses (a base that
one loss alone uses is that loss's logic in another module)."""

from __future__ import annotations

import inspect

import pytest

import rlloss
from rlloss.common import LossModule

MAX_PRIVATE_BASES = 2


def public_losses() -> dict[str, type]:
    """The public loss classes of ``rlloss.__all__`` (subclasses of ``LossModule``)."""
    classes = {name: getattr(rlloss, name) for name in rlloss.__all__}
    return {
        name: cls
        for name, cls in classes.items()
        if inspect.isclass(cls) and issubclass(cls, LossModule) and cls is not LossModule
    }


PUBLIC = public_losses()


def private_bases(cls: type) -> list[type]:
    """The classes of ``cls``'s MRO between it and ``LossModule`` that are not public losses
    (a public parent such as ``MAPPOLoss``'s ``ClipPPOLoss``, which TorchRL has too, is not
    counted)."""
    mro = cls.__mro__
    between = mro[1 : mro.index(LossModule)]
    public = set(PUBLIC.values())
    return [base for base in between if base not in public]


def test_public_losses_are_found():
    assert {"SACLoss", "DiscreteSACLoss", "CQLLoss", "ClipPPOLoss", "DQNLoss"} <= set(PUBLIC)


def test_private_bases_counts_only_non_public_classes():
    class _Base(LossModule):
        pass

    class _Middle(_Base):
        pass

    class Leaf(_Middle):
        pass

    assert private_bases(Leaf) == [_Middle, _Base]
    assert private_bases(rlloss.MAPPOLoss) == private_bases(rlloss.ClipPPOLoss)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_at_most_two_private_bases(name):
    bases = [base.__qualname__ for base in private_bases(PUBLIC[name])]
    assert len(bases) <= MAX_PRIVATE_BASES, (
        f"{name} has {len(bases)} private bases between it and LossModule ({bases}); keep at "
        f"most {MAX_PRIVATE_BASES}: fold a base into the classes that need it"
    )


def shared_by() -> dict[type, list[str]]:
    """Each private base of a public loss, and the public losses that derive from it."""
    users: dict[type, list[str]] = {}
    for name, cls in PUBLIC.items():
        for base in private_bases(cls):
            users.setdefault(base, []).append(name)
    return users


SHARED_BY = shared_by()


@pytest.mark.parametrize("base", sorted(SHARED_BY, key=lambda b: f"{b.__module__}.{b.__name__}"))
def test_every_private_base_is_shared_by_two_public_losses(base):
    users = sorted(SHARED_BY[base])
    assert len(users) >= 2, (
        f"{base.__module__}.{base.__qualname__} is a base of one public loss only ({users}): "
        "move its logic into that loss's module"
    )
