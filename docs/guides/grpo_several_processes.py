"""GRPO on several processes: data parallel (DDP) or sharded parameters (FSDP2), micro-batches
and one global token count.

A tiny Qwen2 (built from a config, nothing downloaded) learns a toy task with a verifiable
reward: after a prompt of 4 random tokens it answers 4 tokens, and the reward is the fraction of
them above the prompt's last token (a random answer scores about 0.43). Each rank samples ``--prompts`` prompts x ``--group``
completions with TorchRL's ``TransformersWrapper`` (``generate=True``), computes the group-relative
advantage, and takes one optimiser step over ``--micro-batches`` micro-batches: every
micro-batch's loss is divided by the token count of the whole step (every micro-batch of every
rank, ``num_items_in_batch``), so the accumulated and rank-averaged gradient is the one of the
token mean over the global batch, whatever the split.

Run (2 processes on this machine, gloo on CPU; ``--shard fsdp`` shards every decoder layer and
the model with ``torch.distributed.fsdp.fully_shard``, ``--shard ddp`` replicates it):

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 \\
        docs/guides/grpo_several_processes.py --shard fsdp --steps 30

Started without torchrun it trains in one process. On GPUs, each rank uses ``LOCAL_RANK`` and
NCCL. Rank 0 prints the mean reward over every rank's completions each step, and last
``final_reward=``.
"""

from __future__ import annotations

import argparse
import os

import tokenizers
import torch
import torch.distributed as dist
import transformers
from tensordict import MetaData, TensorDict
from torchrl.modules.llm import TransformersWrapper
from torchrl.modules.llm.policies.common import LogProbs, Masks, Tokens

from rlloss.functional import group_relative_advantage
from rlloss.llm import GRPOLoss
from rlloss.training.distributed import all_mean, all_sum

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--shard", choices=["fsdp", "ddp"], default="fsdp")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--prompts", type=int, default=8, help="prompts a rank samples a step")
parser.add_argument("--group", type=int, default=4, help="completions of each prompt")
parser.add_argument("--micro-batches", type=int, default=2)
parser.add_argument("--lr", type=float, default=1e-2)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

# ------------------------------------------------------------------ processes and devices
distributed = "WORLD_SIZE" in os.environ
cuda = torch.cuda.is_available()
if distributed:
    dist.init_process_group("nccl" if cuda else "gloo")
rank = dist.get_rank() if distributed else 0
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
torch.manual_seed(args.seed)  # the same initial weights on every rank

# ------------------------------------------------------------------ the model and tokenizer
VOCAB, PROMPT, ANSWER = 16, 4, 4
words = {"<pad>": 0, "<eos>": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="<pad>"))
backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
tokenizer = transformers.PreTrainedTokenizerFast(
    tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", padding_side="left"
)
config = transformers.Qwen2Config(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=1,
)
model = transformers.Qwen2ForCausalLM(config).to(device)
if distributed and args.shard == "fsdp":
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)  # every parameter a DTensor, gathered layer by layer in forward

sampler = TransformersWrapper(
    model,
    tokenizer=tokenizer,
    generate=True,
    input_mode="tokens",
    pad_output=True,
    # a fixed answer length: every rank runs the same number of forward passes (FSDP needs it)
    generate_kwargs={"max_new_tokens": ANSWER, "do_sample": True, "suppress_tokens": [0, 1]},
)
actor = TransformersWrapper(
    model,
    tokenizer=tokenizer,
    generate=False,
    input_mode="tokens",
    pad_output=True,
    return_log_probs=True,
)
loss = GRPOLoss(actor, entropy_bonus=False, masking_strategy="sft")  # the token mean
# DDP averages the gradients of the loss module's parameters; FSDP2's sharded model does that
# itself (reduce-scatter, averaged over the ranks)
if distributed and args.shard == "ddp":
    train = torch.nn.parallel.DistributedDataParallel(loss)
else:
    train = loss
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)


def sample_batch(step: int) -> tuple[TensorDict, torch.Tensor]:
    """This rank's prompts x group completions, their tokens' log-probs at sampling, rewards
    and group-relative advantages."""
    generator = torch.Generator().manual_seed(args.seed * 100_003 + step * 101 + rank)
    prompts = torch.randint(2, VOCAB, (args.prompts, PROMPT), generator=generator)
    prompts = prompts.repeat_interleave(args.group, 0).to(device)
    n = prompts.shape[0]
    batch = TensorDict(
        tokens=Tokens(prompt=prompts, batch_size=[n]),
        masks=Masks(all_attention_mask=torch.ones_like(prompts, dtype=torch.bool), batch_size=[n]),
        batch_size=[n],
        device=device,
    )
    with torch.no_grad():
        out = sampler(batch)
    answer = out["tokens", "response"]
    rewards = (answer > prompts[:, -1:]).float().mean(-1)
    batch = TensorDict(
        tokens=Tokens(
            full=out["tokens", "full"], prompt=prompts, padded=MetaData(True), batch_size=[n]
        ),
        masks=Masks(
            all_attention_mask=out["masks", "all_attention_mask"],
            all_assistant_mask=None,
            padded=MetaData(True),
            batch_size=[n],
        ),
        batch_size=[n],
        device=device,
    )
    with torch.no_grad():
        log_probs = actor(batch.copy())["log_probs", "full"]
    batch["log_probs"] = LogProbs(full=log_probs, padded=MetaData(True), batch_size=[n])
    advantage = group_relative_advantage(rewards.view(-1, args.group)).view(n, 1, 1)
    batch["advantage"] = advantage.expand(n, batch["tokens", "full"].shape[-1], 1)
    return batch, rewards


for step in range(args.steps):
    batch, rewards = sample_batch(step)
    # the global normaliser: the response tokens of every micro-batch of every rank (here
    # ANSWER per completion; in general, count the tokens the loss's mask keeps)
    num_items = all_sum(torch.tensor(float(batch.shape[0] * ANSWER), device=device))
    optimizer.zero_grad()
    for micro_batch in batch.chunk(args.micro_batches):
        out = train(micro_batch, num_items_in_batch=num_items)
        out.loss_objective.backward()
    optimizer.step()
    mean_reward = all_mean(rewards.mean())
    if rank == 0:
        print(f"step {step:3d}  reward {mean_reward.item():.3f}", flush=True)

if rank == 0:
    world = dist.get_world_size() if distributed else 1
    print(f"processes={world} shard={args.shard if distributed else 'none'}")
    print(f"final_reward={mean_reward.item():.3f}")
if distributed:
    dist.destroy_process_group()
