"""GRPOLoss, DAPO, CISPOLoss (drop-ins for torchrl.objectives.llm's) and DrGRPOLoss, GSPOLoss
(beyond TorchRL) on a tiny Qwen2 wrapped in TorchRL's TransformersWrapper: parity with TorchRL's
classes (values and gradients), the paper's formulas where rlloss departs from TorchRL, the
mask / aggregation / shape contract (a table), and no host read in forward or backward."""

from __future__ import annotations

import itertools

import pytest
import tensordict
import torch

pytest.importorskip("transformers")

import torchrl.objectives.llm as torchrl_llm  # noqa: E402

import rlloss.llm as rl_llm  # noqa: E402
from tests.llm_nets import tiny_actor, token_batch  # noqa: E402

LOSS_KEYS = ("loss_objective", "loss_entropy", "loss_kl_to_ref", "loss_kl_to_inference")
KEYWORDS = [
    {},
    {"clip_epsilon": (0.2, 0.28)},
    {"aggregation": "prompt_mean"},
    {"aggregation": "none"},
    {"kl_to_ref_coeff": 0.1, "kl_to_inference_coeff": 0.05},
    {"kl_mask_threshold": 0.5},
    {"masking_strategy": "generic", "entropy_bonus": False},
]


@pytest.fixture(autouse=True)
def list_to_stack():
    with tensordict.set_list_to_stack(True):
        yield


@pytest.fixture(scope="module")
def actor():
    return tiny_actor()


def run(loss, batch, model):
    """The outputs, and the gradient of the sum of the loss entries on the model's weights."""
    model.zero_grad()
    out = loss(batch.clone())
    sum(out.get(k).sum() for k in LOSS_KEYS if out.get(k) is not None).backward()
    return out, [p.grad.clone() for p in model.parameters()]


def valid_tokens(actor, batch, strategy="sft"):
    methods = {"sft": "_get_sft_dist", "generic": "_get_generic_dist", "rlhf": "_get_rlhf_dist"}
    dist = getattr(actor, methods[strategy])(batch.clone())
    return dist.mask


@pytest.mark.parametrize("name", ["GRPOLoss", "DAPO"])
@pytest.mark.parametrize("keywords", KEYWORDS, ids=lambda k: "-".join(map(str, k)) or "default")
def test_parity_with_torchrl_values_and_gradients(actor, name, keywords):
    batch = token_batch()
    theirs, their_grad = run(getattr(torchrl_llm, name)(actor, **keywords), batch, actor.model)
    ours, our_grad = run(getattr(rl_llm, name)(actor, **keywords), batch, actor.model)
    assert type(ours) is type(theirs)
    for key in (*LOSS_KEYS, "ESS", "kl_to_ref", "kl_to_inference"):
        if theirs.get(key) is None:
            assert ours.get(key) is None, key
            continue
        # TorchRL's prompt_mean keeps a [1] dim; rlloss returns a scalar
        torch.testing.assert_close(ours.get(key), theirs.get(key).reshape(ours.get(key).shape))
    for mine, reference in zip(our_grad, their_grad, strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-7)


def test_diagnostics_average_the_valid_tokens(actor):
    """rlloss's clip_fraction, kl_approx and entropy are means over the tokens the loss counts;
    TorchRL's average every position of the padded batch (prompt and padding as zeros)."""
    batch = token_batch()
    mask = valid_tokens(actor, batch)
    ours = rl_llm.GRPOLoss(actor)(batch.clone())
    theirs = torchrl_llm.GRPOLoss(actor)(batch.clone())
    share = mask.float().mean()
    torch.testing.assert_close(ours.clip_fraction * share, theirs.clip_fraction)
    torch.testing.assert_close(ours.kl_approx * share, theirs.kl_approx)
    logits = actor._get_sft_dist(batch.clone()).logits.detach()
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(ours.entropy, entropy[mask].mean())


@pytest.mark.parametrize("eps", [0.2, (0.2, 0.28), 10.0])
def test_cispo_values_match_torchrl_gradients_are_the_papers(actor, eps):
    """Same values; rlloss keeps the gradient of clipped tokens (MiniMax-M1, eq. 4: the clipped
    weight is a stop-gradient constant), TorchRL's clamp drops it. With nothing clipped
    (eps 10: the ratio stays inside [1 - 0.99..., 11]) the gradients agree."""
    batch = token_batch(spread=0.0)
    lo, hi = (0.99, eps) if eps == 10.0 else (eps if isinstance(eps, tuple) else (eps, eps))
    keywords = {"clip_epsilon": (lo, hi), "entropy_bonus": False}
    theirs, their_grad = run(torchrl_llm.CISPOLoss(actor, **keywords), batch, actor.model)
    ours, our_grad = run(rl_llm.CISPOLoss(actor, **keywords), batch, actor.model)
    assert type(ours) is torchrl_llm.CISPOLossOutput
    torch.testing.assert_close(ours.loss_objective, theirs.loss_objective)
    # the paper's gradient written out: d/dtheta of -mean_t sg(clip(r_t)) A_t log pi_t
    actor.model.zero_grad()
    dist = actor._get_sft_dist(batch.clone())
    mask = dist.mask
    log_prob = dist.log_prob(batch["tokens", "full"])
    log_ratio = torch.where(mask, log_prob - batch["log_probs", "full"], 0.0).detach()
    weight = log_ratio.exp().clamp(1 - lo, 1 + hi)
    advantage = batch["advantage"].squeeze(-1)
    (-(weight * advantage * torch.where(mask, log_prob, 0.0)).sum() / mask.sum()).backward()
    for mine, paper in zip(our_grad, [p.grad for p in actor.model.parameters()], strict=True):
        torch.testing.assert_close(mine, paper, rtol=1e-4, atol=1e-6)
    clipped = ours.clip_fraction > 0
    same = all(torch.allclose(a, b, atol=1e-7) for a, b in zip(our_grad, their_grad, strict=True))
    assert same != bool(clipped)


def test_dr_grpo_sums_each_sequence_over_a_constant(actor):
    batch = token_batch()
    mask = valid_tokens(actor, batch)
    per_token = rl_llm.GRPOLoss(actor, aggregation="none", entropy_bonus=False)(batch.clone())
    values = per_token.loss_objective.squeeze(-1)
    for max_tokens in (None, 64):
        loss = rl_llm.DrGRPOLoss(actor, max_tokens=max_tokens, entropy_bonus=False)
        out = loss(batch.clone()).loss_objective
        constant = mask.shape[-1] if max_tokens is None else max_tokens
        torch.testing.assert_close(out, (values.sum(-1) / constant).mean())
    assert values[~mask].abs().max() == 0


def test_gspo_clips_the_sequence_ratio(actor):
    """GSPO's objective with one advantage per sequence: mean_i min(s_i A_i, clip(s_i) A_i),
    ``s_i = exp(mean_t log r_{i,t})`` (arXiv:2507.18071, eq. 5-7)."""
    batch = token_batch(spread=0.0)
    batch["advantage"] = torch.tensor([1.0, -0.5, 2.0])  # one per sequence, [B]
    eps = (0.02, 0.03)
    out = rl_llm.GSPOLoss(actor, clip_epsilon=eps, entropy_bonus=False)(batch.clone())
    dist = actor._get_sft_dist(batch.clone())
    mask = dist.mask
    log_prob = dist.log_prob(batch["tokens", "full"]).detach()
    log_ratio = torch.where(mask, log_prob - batch["log_probs", "full"], 0.0)
    ratio = (log_ratio.sum(-1) / mask.sum(-1)).exp()
    a = batch["advantage"]
    expected = -torch.minimum(ratio * a, ratio.clamp(1 - eps[0], 1 + eps[1]) * a).mean()
    torch.testing.assert_close(out.loss_objective, expected)


# ------------------------------------------------------------------------- the mask contract

ADVANTAGES = {  # name -> (shape builder, accepted)
    "token[B,T,1]": (lambda b, t: (b, t, 1), True),
    "token[B,T]": (lambda b, t: (b, t), True),
    "sequence[B]": (lambda b, t: (b,), True),
    "sequence[B,1]": (lambda b, t: (b, 1), True),
    "bad[B,T+1]": (lambda b, t: (b, t + 1), False),
    "bad[B,2]": (lambda b, t: (b, 2), False),
}
# strategy -> whether it works on these batches: "rlhf" reads ("masks", "all_assistant_mask"),
# absent from a tokens-only batch (the actor's error names it); "rlhf+mask" stores one
STRATEGIES = {"sft": True, "generic": True, "rlhf": False, "rlhf+mask": True}
AGGREGATIONS = ["token_mean", "prompt_mean", "seq_sum_constant", "none"]
TABLE = list(itertools.product(STRATEGIES, AGGREGATIONS, ADVANTAGES))


@pytest.mark.parametrize(("strategy", "aggregation", "advantage"), TABLE)
def test_mask_aggregation_advantage_table(actor, strategy, aggregation, advantage):
    """Every masking strategy x aggregation x advantage shape either works (a finite loss of
    the aggregation's shape, padding and prompt at 0) or raises an error naming the entry and
    the shapes."""
    batch = token_batch()
    b, t = batch["tokens", "full"].shape
    shape, accepted = ADVANTAGES[advantage][0](b, t), ADVANTAGES[advantage][1]
    batch["advantage"] = torch.randn(shape)
    if strategy == "rlhf+mask":
        assistant = torch.zeros(b, t, dtype=torch.bool)
        assistant[:, t // 2 :] = True
        batch["masks", "all_assistant_mask"] = assistant
    masking = strategy.split("+")[0]
    loss = rl_llm.GRPOLoss(actor, masking_strategy=masking, aggregation=aggregation)
    if not STRATEGIES[strategy]:
        with pytest.raises(ValueError, match="all_assistant_mask"):
            loss(batch)
        return
    if not accepted:
        with pytest.raises(ValueError, match=rf"advantage.*{tuple(shape)}.*{(b, t)}"):
            loss(batch)
        return
    out = loss(batch)
    expected_shape = (b, t, 1) if aggregation == "none" else ()
    for key in ("loss_objective", "loss_entropy"):
        value = out.get(key)
        assert value.shape == expected_shape and torch.isfinite(value).all()
    if aggregation == "none":
        mask = valid_tokens(actor, batch, masking)
        assert (out.loss_objective.squeeze(-1)[~mask] == 0).all()


@pytest.mark.parametrize(
    ("entry", "shape"),
    [(("log_probs", "full"), (3, 9)), (("next", "ref_log_probs", "full"), (3, 11))],
)
def test_a_log_prob_entry_of_another_shape_is_named(actor, entry, shape):
    batch = token_batch()
    batch[entry] = torch.zeros(shape)
    loss = rl_llm.GRPOLoss(actor, kl_to_ref_coeff=0.1)
    with pytest.raises(ValueError, match=rf"{entry[-2]}.*") as error:
        loss(batch)
    assert str(shape) in str(error.value) and "(3, 10)" in str(error.value)


def test_missing_entries_raise_torchrls_errors(actor):
    batch = token_batch()
    with pytest.raises(KeyError, match="Couldn't find the log-prob"):
        rl_llm.GRPOLoss(actor)(batch.exclude(("log_probs", "full")))
    with pytest.raises(KeyError, match="Couldn't find the ref log-prob"):
        rl_llm.GRPOLoss(actor, kl_to_ref_coeff=0.1)(
            batch.exclude(("next", "ref_log_probs", "full"))
        )
    with pytest.raises(ValueError, match="Advantage key advantage not in tensordict"):
        rl_llm.GRPOLoss(actor)(batch.exclude("advantage"))
    out = rl_llm.GRPOLoss(actor)(batch.exclude(("next", "ref_log_probs", "full")))
    assert torch.isfinite(out.loss_objective)


def test_constructor_checks_and_keys(actor):
    with pytest.raises(ValueError, match="masking_strategy must be one of"):
        rl_llm.GRPOLoss(actor, masking_strategy="response")
    with pytest.raises(ValueError, match="aggregation must be one of"):
        rl_llm.GRPOLoss(actor, aggregation="mean")
    with pytest.raises(ValueError, match="clip_epsilon"):
        rl_llm.GRPOLoss(actor, clip_epsilon=(0.1, 0.2, 0.3))
    with pytest.raises(TypeError, match="unexpected keyword"):
        rl_llm.GRPOLoss(actor, clip_epsilon_low=0.1)
    loss = rl_llm.GRPOLoss(actor, clip_epsilon=(0.1, 0.3))
    assert torchrl_llm.GRPOLoss(actor).in_keys == rl_llm.GRPOLoss(actor).in_keys
    assert torchrl_llm.GRPOLoss(actor).out_keys == rl_llm.GRPOLoss(actor).out_keys
    loss.set_keys(advantage="adv")
    assert loss.tensor_keys.advantage == "adv" and "adv" in loss.in_keys
    assert {"clip_epsilon_low", "clip_epsilon_high"} <= set(loss.state_dict())
    loss.clip_epsilon_high = 0.4  # a schedule writes the buffer in place
    assert loss.clip_epsilon_high.item() == pytest.approx(0.4)


def test_token_mean_aggregation_of_torchrls_test():
    loss = rl_llm.GRPOLoss(actor_network=None, aggregation="token_mean")
    value = torch.arange(6, dtype=torch.float32).view(2, 3, 1)
    mask = torch.tensor([[True, False, True], [False, True, True]])
    torch.testing.assert_close(loss._aggregate_loss_value(value, mask), value[mask].mean())


class _LinearTokenActor(torch.nn.Module):
    """A bigram "language model" with TorchRL's distribution contract (``_get_sft_dist``), so
    that the host-read check sees the loss's operations only (the transformers wrapper itself
    reads tensors on the host)."""

    def __init__(self):
        super().__init__()
        self.logits = torch.nn.Embedding(32, 32)

    def _get_sft_dist(self, tensordict):
        from torchrl.modules.distributions import LLMMaskedCategorical

        tokens = tensordict["tokens", "full"]
        mask = torch.ones_like(tokens, dtype=torch.bool)
        mask[..., :4] = False
        return LLMMaskedCategorical(logits=self.logits(tokens), mask=mask)


@pytest.mark.parametrize("name", ["GRPOLoss", "CISPOLoss", "DrGRPOLoss", "GSPOLoss"])
def test_forward_and_backward_read_no_tensor_on_the_host(name):
    from tests.test_contract import HostReads

    loss = getattr(rl_llm, name)(
        _LinearTokenActor(),
        kl_to_ref_coeff=0.1,
        kl_to_inference_coeff=0.1,
        kl_mask_threshold=1.0,
        max_tokens=16,  # Dr. GRPO's constant, needed with a global normaliser
    )
    batch = token_batch()
    loss(batch.clone())
    count = torch.tensor(17.0)  # a global normaliser is never read on the host either
    for call in ({}, {"num_items_in_batch": count}):
        with HostReads() as reads:
            out = loss(batch.clone(), **call)
            sum(out.get(k) for k in LOSS_KEYS).backward()
        assert not reads.seen, call


@pytest.mark.slow
@pytest.mark.parametrize("name", ["GRPOLoss", "CISPOLoss", "DrGRPOLoss", "GSPOLoss"])
def test_compiles_fullgraph_without_recompiling(name):
    """One graph for batches of the same padded shape, also after a scheduled clip change (the
    clip bounds are buffers written in place); the compiled values equal eager ones."""
    import copy

    eager = getattr(rl_llm, name)(_LinearTokenActor(), kl_to_ref_coeff=0.1, kl_mask_threshold=1.0)
    twin = copy.deepcopy(eager)

    def total(loss, batch):
        out = loss(batch)
        return sum(out.get(k) for k in LOSS_KEYS if out.get(k) is not None)

    compiled = torch.compile(total, fullgraph=True)
    batches = [token_batch(seed=seed) for seed in range(3)]
    torch.testing.assert_close(compiled(twin, batches[0]), total(eager, batches[0]))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step, batch in enumerate(batches[1:]):
            if step == 1:
                for loss in (eager, twin):
                    loss.clip_epsilon_high = 0.3
            torch.testing.assert_close(compiled(twin, batch), total(eager, batch))


@pytest.mark.parametrize("name", ["GRPOLoss", "CISPOLoss", "GSPOLoss"])
def test_diagnostics_with_a_trust_mask_average_the_tokens_the_loss_counts(actor, name):
    """With ``kl_mask_threshold``, ``clip_fraction``, ``kl_approx`` and ``entropy`` are means
    over the tokens the trust mask keeps (those the loss counts), not over the actor's mask:
    checked against the means computed by hand, which differ from the actor-mask means."""
    batch = token_batch(spread=0.0)
    threshold = 0.3
    loss = getattr(rl_llm, name)(actor, clip_epsilon=(0.2, 0.2), kl_mask_threshold=threshold)
    out = loss(batch.clone())
    dist = actor._get_sft_dist(batch.clone())
    log_prob = dist.log_prob(batch["tokens", "full"]).detach()
    old = batch["log_probs", "full"]
    mask = dist.mask
    keep = mask & (0.5 * (log_prob - old).square() <= threshold)
    assert 0 < keep.sum() < mask.sum()
    log_ratio = torch.where(mask, log_prob - old, 0.0)
    if name == "GSPOLoss":
        sequence = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
        log_ratio_for_clip = torch.where(mask, sequence.expand_as(log_ratio), 0.0)
    else:
        log_ratio_for_clip = log_ratio
    clipped = (log_ratio_for_clip.abs() > 0) & (
        (log_ratio_for_clip < torch.log1p(torch.tensor(-0.2)))
        | (log_ratio_for_clip > torch.log1p(torch.tensor(0.2)))
    )
    logits = dist.logits.detach()
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(out.clip_fraction, clipped[keep].float().mean())
    torch.testing.assert_close(out.kl_approx, -log_ratio[keep].mean())
    torch.testing.assert_close(out.entropy, entropy[keep].mean())
    assert not torch.allclose(out.entropy, entropy[mask].mean())


@pytest.mark.parametrize(
    ("name", "torchrl_name"),
    [
        ("GRPOLoss", "GRPOLoss"),
        ("DAPO", "DAPO"),
        ("CISPOLoss", "CISPOLoss"),
        ("DrGRPOLoss", "GRPOLoss"),
        ("GSPOLoss", "GRPOLoss"),
        ("SFTLoss", "SFTLoss"),
        ("DistillationLoss", "DistillationLoss"),
        ("MCAdvantage", "MCAdvantage"),
        ("MCAdvantageSelector", "MCAdvantageSelector"),
    ],
)
def test_signature_names_every_torchrl_keyword(name, torchrl_name):
    """No catch-all; every keyword of TorchRL 0.14.1's class named, of the same kind, in the
    same order, with the same default (Dr. GRPO's and GSPO's documented defaults aside, and
    rlloss's own keywords after TorchRL's)."""
    import inspect

    ours = inspect.signature(getattr(rl_llm, name).__init__).parameters
    theirs = inspect.signature(getattr(torchrl_llm, torchrl_name).__init__).parameters
    assert all(p.kind is not p.VAR_KEYWORD for p in ours.values()), name
    named = [k for k, p in theirs.items() if p.kind is not p.VAR_KEYWORD]
    assert list(ours)[: len(named)] == named
    own_defaults = {
        "DrGRPOLoss": {"aggregation": "seq_sum_constant"},
        "GSPOLoss": {"clip_epsilon": (3e-4, 4e-4), "aggregation": "prompt_mean"},
    }.get(name, {})
    for key in named:
        assert ours[key].kind is theirs[key].kind, key
        expected = own_defaults.get(key, theirs[key].default)
        assert ours[key].default == expected, (key, ours[key].default, expected)
    for key in list(ours)[len(named) :]:
        assert ours[key].kind is inspect.Parameter.KEYWORD_ONLY and key != "self"
        assert ours[key].annotation is not inspect.Parameter.empty, key
