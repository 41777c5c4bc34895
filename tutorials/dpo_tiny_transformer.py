"""SFT then DPO on a tiny transformer that learns to reverse strings, on CPU, nothing downloaded.

The preference-optimisation counterpart of ``grpo_tiny_transformer.py``: the same 2-layer Qwen2
built from a ``transformers`` config (random initialisation, 124,416 parameters), the same
character-level vocabulary of 15 tokens and the same task (reverse a string of 4 letters from
"abcdefgh"; the reward is the fraction of the answer's 4 characters that are right), wrapped in
TorchRL's ``TransformersWrapper`` and fed TorchRL's LLM data classes (``History`` chats,
``Tokens``, ``Masks``).

1. **SFT** (``SFTLoss``): ``--sft-steps`` (default 20) steps of Adam (lr 3e-3) on 64 chats
   each, the user turn holding the string and the assistant turn its reverse. Kept short on
   purpose: the SFT checkpoint reverses only part of the strings.
2. **DPO** (Rafailov et al., arXiv:2305.18290; ``DPOLoss``): a frozen copy of the SFT model is
   the reference. Each step draws 32 prompts and builds one preference pair per prompt with a
   rule: the **chosen** answer is the correct reversal, the **rejected** one a near miss, the
   correct reversal with one character (at a random position) replaced by another letter. The
   pairs are TensorDict entries ``"chosen"`` and ``"rejected"`` in the wrapper's token layout
   (``Tokens(full, prompt)``, ``Masks``), the loss scores the answer tokens
   (``masking_strategy="sft"``); one Adam step (lr 1e-3) on ``loss_dpo`` with ``beta=0.5``.
   ``--loss-type`` picks TRL's variant (``sigmoid``, ``ipo``, ``hinge``, ``robust`` with
   ``label_smoothing=0.1``); ``--variant simpo`` trains with ``SimPOLoss`` instead (no
   reference, ``beta=2``, ``gamma=1``).

``--total-frames`` counts the **preference pairs** of the DPO phase (default 6,400: 200 steps
of 32). Before and after DPO, on 256 strings drawn with another seed: the task reward of one
sampled completion per string (temperature 1) and of the greedy one, and the **preference
accuracy**, the fraction of 256 held-out pairs (correct reversal, near miss) whose correct
answer the model finds the more likely (``log pi(chosen) > log pi(rejected)``). The pad and
end-of-sequence tokens are suppressed while sampling (fixed-length answers).

Budget: 20 SFT steps and 6,400 pairs (200 DPO steps), one CPU thread.

Results (the defaults, DPO ``sigmoid``, seeds 0, 1, 2; on the 256 evaluation strings or pairs):

==========================================  ===============  ===============  ===============
measure (after SFT / after DPO)             seed 0           seed 1           seed 2
==========================================  ===============  ===============  ===============
preference accuracy (256 held-out pairs)    0.797 / 0.988    0.875 / 1.000    0.863 / 0.957
reward, one sampled completion              0.199 / 0.604    0.263 / 0.759    0.205 / 0.422
reward, greedy completion                   0.471 / 0.878    0.554 / 0.984    0.472 / 0.654
==========================================  ===============  ===============  ===============

DPO on pairs that only say "the correct reversal beats this near miss" raises the preference
accuracy on held-out pairs to 0.96-1.00 and, with it, the task reward of the model's own
completions: sampled from 0.20-0.26 to 0.42-0.76, greedy from 0.47-0.55 to 0.65-0.98, with no
reward model and no sampling during training.

The other losses, the same budget (after the preference phase: preference accuracy / sampled
reward / greedy reward; after SFT as above). ``simpo`` is ``--variant simpo`` (``SimPOLoss``,
no reference); the others ``--loss-type`` (``robust`` with ``label_smoothing=0.1``):

========  =====================  =====================  =====================
run       seed 0                 seed 1                 seed 2
========  =====================  =====================  =====================
simpo     0.996 / 0.729 / 0.938  0.996 / 0.851 / 0.981  1.000 / 0.416 / 0.648
ipo       1.000 / 0.643 / 0.988
hinge     1.000 / 0.609 / 0.988
robust    0.980 / 0.700 / 0.816
========  =====================  =====================  =====================

TRL's loss in the same loop: ``tests/test_llm_preference_trl.py`` trains a tiny Qwen2 for 5
Adam steps once with ``DPOLoss`` through TorchRL's wrapper and once with TRL 1.16's
``DPOTrainer._compute_loss`` (``sigmoid`` and ``ipo``): equal losses at every step, weights
within 1e-14 after the 5 steps (float64). The tutorial itself imports no TRL (its trainer
modules need ``accelerate`` and ``datasets``).

The documented figures, one line per library and setting, as ``tools/tutorial_runs.py --figures``
reruns them:

    [figures] rlloss, seeds 0 1 2, --total-frames 6400: sft_preference_accuracy = 0.797 0.875 0.863
    [figures] rlloss, seeds 0 1 2, --total-frames 6400: sft_reward = 0.199 0.263 0.205
    [figures] rlloss, seeds 0 1 2, --total-frames 6400: sft_greedy_reward = 0.471 0.554 0.472
    [figures] rlloss, seeds 0 1 2, --total-frames 6400: dpo_preference_accuracy = 0.988 1.000 0.957
    [figures] rlloss, seeds 0 1 2, --total-frames 6400: final_return = 0.604 0.759 0.422
    [figures] rlloss, seeds 0 1 2, --total-frames 6400: dpo_greedy_reward = 0.878 0.984 0.654
    [figures] rlloss, seeds 0 1 2, --variant simpo --total-frames 6400: dpo_preference_accuracy = 0.996 0.996 1.000
    [figures] rlloss, seeds 0 1 2, --variant simpo --total-frames 6400: final_return = 0.729 0.851 0.416
    [figures] rlloss, seeds 0 1 2, --variant simpo --total-frames 6400: dpo_greedy_reward = 0.938 0.981 0.648
    [figures] rlloss, seeds 0, --loss-type ipo --total-frames 6400: dpo_preference_accuracy = 1.000
    [figures] rlloss, seeds 0, --loss-type ipo --total-frames 6400: final_return = 0.643
    [figures] rlloss, seeds 0, --loss-type ipo --total-frames 6400: dpo_greedy_reward = 0.988
    [figures] rlloss, seeds 0, --loss-type hinge --total-frames 6400: dpo_preference_accuracy = 1.000
    [figures] rlloss, seeds 0, --loss-type hinge --total-frames 6400: final_return = 0.609
    [figures] rlloss, seeds 0, --loss-type hinge --total-frames 6400: dpo_greedy_reward = 0.988
    [figures] rlloss, seeds 0, --loss-type robust --total-frames 6400: dpo_preference_accuracy = 0.980
    [figures] rlloss, seeds 0, --loss-type robust --total-frames 6400: final_return = 0.700
    [figures] rlloss, seeds 0, --loss-type robust --total-frames 6400: dpo_greedy_reward = 0.816

Run:
    pip install ".[llm,tutorials]"
    python tutorials/dpo_tiny_transformer.py --seed 0 --out runs/dpo_tiny

It writes ``OUT/returns.csv`` (one row per DPO step: the pairs so far and the step's
``reward_accuracy``, the fraction of its pairs whose chosen answer has the higher implicit
reward) and ``OUT/curve.png``; it prints ``sft_preference_accuracy=``, ``sft_reward=``,
``sft_greedy_reward=``, the same after DPO (``dpo_...``) and last ``final_return=``, the
sampled reward after DPO.
"""

import copy
import time

import _helpers as helpers  # tutorials/_helpers.py
import torch
import transformers
from tensordict import MetaData, TensorDict
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from torchrl.data import History
from torchrl.modules.llm import TransformersWrapper
from torchrl.modules.llm.policies.common import ChatHistory, Masks, Tokens
from tqdm import tqdm

from rlloss import SFTLoss
from rlloss.llm import DPOLoss, SimPOLoss

parser = helpers.tutorial_parser(
    __doc__, "runs/dpo_tiny_transformer", 6_400, "preference pairs of the DPO phase (32 a step)"
)
parser.add_argument("--variant", choices=["dpo", "simpo"], default="dpo", help="DPO or SimPO")
parser.add_argument("--loss-type", choices=["sigmoid", "ipo", "hinge", "robust"], default="sigmoid")
parser.add_argument("--sft-steps", type=int, default=20, help="SFT steps of 64 chats")
parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate for DPO")
parser.add_argument("--beta", type=float, default=0.5, help="DPO's beta")
args = parser.parse_args()
device, start_time = helpers.start(args)  # seeds torch: the initial weights and all sampling
args.out.mkdir(parents=True, exist_ok=True)

SFT_BATCH, SFT_LR = 64, 3e-3
PAIRS, DPO_LR, BETA = 32, args.lr, args.beta

# ---------------------------------------------------------------- the task and its reward
ALPHABET, LENGTH = "abcdefgh", 4
CHAT = {"chat_template_name": "chatml_format"}  # TorchRL's ChatML template (no system turn)


def draw_strings(generator: torch.Generator, n: int) -> list[str]:
    letters = torch.randint(0, len(ALPHABET), (n, LENGTH), generator=generator)
    return ["".join(ALPHABET[i] for i in row) for row in letters.tolist()]


def reward(strings: list[str], responses: list[str]) -> torch.Tensor:
    """The fraction of the answer's characters that are right (an exact answer scores 1)."""
    return torch.tensor(
        [
            sum(a == b for a, b in zip(s[::-1], text[:LENGTH], strict=False)) / LENGTH
            for s, text in zip(strings, responses, strict=True)
        ]
    )


def near_miss(answer: str, generator: torch.Generator) -> str:
    """The rule's rejected answer: ``answer`` with the character at a random position replaced
    by another letter."""
    position = int(torch.randint(LENGTH, (), generator=generator))
    others = [c for c in ALPHABET if c != answer[position]]
    letter = others[int(torch.randint(len(others), (), generator=generator))]
    return answer[:position] + letter + answer[position + 1 :]


# ---------------------------------------------------------------- a character-level tokenizer
SPECIAL = ["<pad>", "<eos>", "<|im_start|>", "<|im_end|>"]
ROLES = ["user", "assistant"]  # one token each, so that a chat stays short
CHARS = list(ALPHABET + "\n")


def char_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """One token per character, the chat template's markers and roles as whole tokens; pads on
    the left, as TorchRL's wrappers do."""
    vocab = {token: i for i, token in enumerate(SPECIAL + ROLES + CHARS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.add_tokens(ROLES)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", padding_side="left"
    )


tokenizer = char_tokenizer()
ID_TO_TOKEN = {i: token for token, i in tokenizer.get_vocab().items()}
CHAR_IDS = torch.tensor([tokenizer.convert_tokens_to_ids(c) for c in ALPHABET])


def decode(tokens: torch.Tensor) -> list[str]:
    return ["".join(ID_TO_TOKEN[t] for t in row) for row in tokens.tolist()]


model = transformers.Qwen2ForCausalLM(
    transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
).to(device)


def chats(strings: list[str], with_answer: bool) -> History:
    """One chat per string: the user turn, and with ``with_answer`` the assistant's reverse."""
    return History.from_chats(
        [
            [{"role": "user", "content": s}]
            + ([{"role": "assistant", "content": s[::-1]}] if with_answer else [])
            for s in strings
        ]
    )


# ---------------------------------------------------------------- phase 1: SFT
sft_actor = TransformersWrapper(
    model,
    tokenizer=tokenizer,
    generate=False,
    input_mode="history",
    pad_output=False,
    return_log_probs=True,
    **CHAT,
)
sft_loss = SFTLoss(sft_actor, tokenizer=tokenizer, tokenizer_kwargs=dict(CHAT))
optimizer = torch.optim.Adam(model.parameters(), lr=SFT_LR)
data = torch.Generator().manual_seed(args.seed)  # the strings of both phases
for _ in tqdm(range(args.sft_steps), desc="SFT"):
    history = chats(draw_strings(data, SFT_BATCH), with_answer=True)
    loss = sft_loss(
        TensorDict(history=ChatHistory(full=history), batch_size=[SFT_BATCH], device=device)
    ).loss_sft
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


# ---------------------------------------------------------------- the preference pairs
def prompts(strings: list[str]) -> torch.Tensor:
    """The chat prompts asking for ``strings`` reversed, tokenized (all of one length)."""
    text = chats(strings, with_answer=False).apply_chat_template(
        tokenizer=tokenizer, add_generation_prompt=True, **CHAT
    )
    return tokenizer(text, return_tensors="pt", padding=True)["input_ids"].to(device)


def responses(prompt: torch.Tensor, answers: list[str]) -> TensorDict:
    """The prompts followed by ``answers`` in the wrapper's token layout: ``Tokens(full,
    prompt)`` and ``Masks`` (no padding: every answer has ``LENGTH`` characters)."""
    answer = torch.stack([CHAR_IDS[[ALPHABET.index(c) for c in a]] for a in answers]).to(device)
    full = torch.cat([prompt, answer], -1)
    n = len(answers)
    return TensorDict(
        tokens=Tokens(full=full, prompt=prompt, padded=MetaData(True), batch_size=[n]),
        masks=Masks(
            all_attention_mask=torch.ones_like(full, dtype=torch.bool),
            all_assistant_mask=None,
            padded=MetaData(True),
            batch_size=[n],
        ),
        batch_size=[n],
        device=device,
    )


def preference_pairs(strings: list[str], generator: torch.Generator) -> TensorDict:
    """One pair per string: the correct reversal (chosen) and a near miss (rejected)."""
    prompt = prompts(strings)
    chosen = [s[::-1] for s in strings]
    rejected = [near_miss(a, generator) for a in chosen]
    return TensorDict(
        chosen=responses(prompt, chosen),
        rejected=responses(prompt, rejected),
        batch_size=[len(strings)],
        device=device,
    )


def wrapper(network) -> TransformersWrapper:
    """``network`` scoring given tokens (no generation), in the token layout."""
    return TransformersWrapper(
        network, tokenizer=tokenizer, generate=False, input_mode="tokens", pad_output=True
    )


# ---------------------------------------------------------------- evaluation
def sampler(do_sample: bool) -> TransformersWrapper:
    """The model generating ``LENGTH`` tokens after a prompt: sampled at temperature 1, or
    greedily; pad and end-of-sequence suppressed (fixed-length answers)."""
    kwargs = {
        "max_new_tokens": LENGTH,
        "do_sample": do_sample,
        "suppress_tokens": [tokenizer.pad_token_id, tokenizer.eos_token_id],
    }
    if do_sample:
        kwargs["temperature"] = 1.0
    return TransformersWrapper(
        model,
        tokenizer=tokenizer,
        generate=True,
        input_mode="tokens",
        pad_output=True,
        generate_kwargs=kwargs,
    )


EVAL_STRINGS = draw_strings(torch.Generator().manual_seed(10_000 + args.seed), 256)
EVAL_PAIRS = preference_pairs(EVAL_STRINGS, torch.Generator().manual_seed(20_000 + args.seed))
scorer = wrapper(model)


def answer_log_likelihood(pairs: TensorDict, name: str) -> torch.Tensor:
    """``log pi(answer | prompt)`` of the entry ``name`` of ``pairs``, summed over the answer
    tokens (the mask ``DPOLoss`` scores with ``masking_strategy="sft"``)."""
    with torch.no_grad():
        dist = scorer._get_sft_dist(pairs[name])
        log_prob = dist.log_prob(pairs[name]["tokens", "full"])
    return torch.where(dist.mask, log_prob, 0.0).sum(-1)


def evaluate() -> tuple[float, float, float]:
    """The preference accuracy on ``EVAL_PAIRS`` and the mean reward on ``EVAL_STRINGS`` of
    one sampled completion each and of the greedy one."""
    chosen = answer_log_likelihood(EVAL_PAIRS, "chosen")
    accuracy = (chosen > answer_log_likelihood(EVAL_PAIRS, "rejected")).float().mean().item()
    prompt = prompts(EVAL_STRINGS)
    rewards = []
    for sample in (True, False):
        td = TensorDict(
            tokens=Tokens(prompt=prompt, batch_size=[len(EVAL_STRINGS)]),
            masks=Masks(all_attention_mask=prompt != tokenizer.pad_token_id, batch_size=[256]),
            batch_size=[len(EVAL_STRINGS)],
            device=device,
        )
        with torch.no_grad():
            out = sampler(sample)(td)
        rewards.append(reward(EVAL_STRINGS, decode(out["tokens", "response"])).mean().item())
    return accuracy, *rewards


before = evaluate()
for name, value in zip(("preference_accuracy", "reward", "greedy_reward"), before, strict=True):
    print(f"sft_{name}={value:.3f}")

# ---------------------------------------------------------------- phase 2: DPO
if args.variant == "dpo":
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    eps = 0.1 if args.loss_type == "robust" else 0.0
    loss_module = DPOLoss(
        wrapper(model),
        reference_network=wrapper(reference),
        beta=BETA,
        loss_type=args.loss_type,
        label_smoothing=eps,
    )
    loss_key = "loss_dpo"
else:
    loss_module = SimPOLoss(wrapper(model), beta=2.0, gamma=1.0)
    loss_key = "loss_simpo"
optimizer = torch.optim.Adam(model.parameters(), lr=DPO_LR)
rule = torch.Generator().manual_seed(30_000 + args.seed)  # the near misses of training
curve = []  # (pairs so far, the step's reward accuracy)
for step in tqdm(range(max(1, args.total_frames // PAIRS)), desc=args.variant):
    out = loss_module(preference_pairs(draw_strings(data, PAIRS), rule))
    optimizer.zero_grad()
    out[loss_key].backward()
    optimizer.step()
    curve.append(((step + 1) * PAIRS, out["reward_accuracy"].item()))

after = evaluate()
helpers.save_learning_curve(
    args.out,
    curve,
    f"{type(loss_module).__name__} after {args.sft_steps} SFT steps",
    xlabel="preference pairs (DPO phase)",
    ylabel="reward accuracy of a step's pairs",
    window=5,
)
print(f"wall_time={time.perf_counter() - start_time:.1f}s")
print(f"cpu_time={time.process_time():.1f}s")  # this process's CPU time, load-independent
for name, value in zip(("preference_accuracy", "reward", "greedy_reward"), after, strict=True):
    print(f"dpo_{name}={value:.3f}")
print(f"final_return={after[1]:.3f}")
