"""TorchRL's constructor keywords that rlloss's classes take otherwise than as they are, in one
table (:data:`TORCHRL_KEYWORDS`) applied by one function (:func:`torchrl_keywords`).

Each class lists the keywords it takes as they are and the TorchRL keywords of its TorchRL
namesake that the table translates (an alias, a keyword TorchRL removed or rlloss does not
support, one accepted without effect); the table says how. This module imports nothing from
rlloss.
"""

from __future__ import annotations

# TorchRL's constructor keywords that rlloss takes otherwise than as they are, for the classes
# that list them as ``translated`` (see `torchrl_keywords`): name -> (rule, detail). "alias":
# another name of the keyword ``detail``; "renamed": removed by TorchRL v0.11 for ``detail``
# (TorchRL's TypeError); "key": a ``*_key`` keyword TorchRL removed, the key is set with
# ``set_keys(<detail>=...)`` (TorchRL's RuntimeError); "refused": not supported (a TypeError
# saying ``detail``); "ignored": accepted without effect (rlloss's path gives the same numbers)
# and kept as an attribute, ``detail`` by default, as TorchRL keeps it.
TORCHRL_KEYWORDS: dict[str, tuple[str, object]] = {
    "actor": ("alias", "actor_network"),
    "critic": ("alias", "critic_network"),
    "entropy_coef": ("renamed", "entropy_coeff"),
    "critic_coef": ("renamed", "critic_coeff"),
    "advantage_key": ("key", "advantage"),
    "value_target_key": ("key", "value_target"),
    "value_key": ("key", "value"),
    "priority_key": ("key", "priority"),
    "gamma": (
        "refused",
        "gamma is not a loss argument: pass it to the value estimator, "
        "loss.make_value_estimator(ValueEstimators.GAE, gamma=..., lmbda=...).",
    ),
    "deactivate_vmap": ("ignored", False),
}


class NotGiven:
    """The type of :data:`NOT_GIVEN`, the default of the keywords TorchRL removed
    (``entropy_coef``, ``critic_coef``): TorchRL raises whenever one is given, ``None``
    included, so ``None`` cannot mark "not given"."""

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN = NotGiven()


def torchrl_keywords(module, given: dict, accepted, translated=()) -> dict:
    """The keywords of ``given`` that ``module``'s class takes as they are (``accepted``), with
    TorchRL's keywords it lists in ``translated`` applied as :data:`TORCHRL_KEYWORDS` says
    (aliases renamed when not ``None``, refusals raised when given, ignored keywords set on
    ``module``); any other keyword raises Python's ``TypeError`` (listing ``accepted``). A
    keyword whose value is :data:`NOT_GIVEN` counts as not given."""
    owner = type(module).__name__
    given = {name: value for name, value in given.items() if value is not NOT_GIVEN}
    taken = {}
    for name, value in given.items():
        if name in accepted:
            taken[name] = value
        elif name in translated:
            _apply_torchrl_keyword(owner, name, value, taken)
    unknown = sorted(set(given) - set(accepted) - set(translated))
    if unknown:
        also = f"; it takes {sorted(accepted)} besides its named arguments" if accepted else ""
        raise TypeError(f"{owner} got unexpected keyword argument(s) {unknown}{also}.")
    for name in translated:
        rule, default = TORCHRL_KEYWORDS[name]
        if rule == "ignored":
            module.__dict__[name] = given.get(name, default)  # a plain attribute, any time
    return taken


def _apply_torchrl_keyword(owner: str, name: str, value, taken: dict) -> None:
    rule, detail = TORCHRL_KEYWORDS[name]
    if rule == "renamed":  # TorchRL raises whatever the value
        raise TypeError(f"'{name}' has been removed in torchrl v0.11. Use '{detail}'.")
    if value is None or rule == "ignored":
        return
    if rule == "alias":
        taken[detail] = value
    elif rule == "key":
        raise RuntimeError(
            f"{owner}: setting {name!r} via constructor is deprecated; "
            f"use .set_keys({detail}={value!r}) instead."
        )
    else:
        raise TypeError(f"{owner}: {detail}")


def given_networks(module, actor_network, critic_network, actor, critic, torchrl: dict) -> tuple:
    """An on-policy loss's two networks, given as such or under TorchRL's ``actor=`` /
    ``critic=`` aliases (BenchMARL's MAPPO and IPPO use only those); the actor is required.
    ``torchrl``: the class's other TorchRL keywords of :data:`TORCHRL_KEYWORDS`, applied."""
    given = torchrl_keywords(
        module,
        {
            "actor_network": actor_network,
            "critic_network": critic_network,
            "actor": actor,
            "critic": critic,
            **torchrl,
        },
        accepted=("actor_network", "critic_network"),
        translated=("actor", "critic", *torchrl),
    )
    if given["actor_network"] is None:
        raise TypeError(
            f"{type(module).__name__}.__init__() missing 1 required argument: 'actor_network' "
            "(or TorchRL's alias actor=)."
        )
    return given["actor_network"], given["critic_network"]
