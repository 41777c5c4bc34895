"""Run one BenchMARL experiment on a VMAS task with TorchRL's or rlloss's loss classes.

Usage (from the repository root, in a venv with benchmarl, vmas, torchrl 0.14.1; see README.md):

    python tools/benchmarl/run.py --lib rlloss --algo mappo --task balance --seed 0 \
        --frames 120000 --out /tmp/marl

Writes ``<out>/<algo>_<task>_<lib>_s<seed>_<frames>.json``: the arguments, the wall time, the
outcome (``ok`` or ``crash`` with the traceback) and one row per iteration (frames so far,
BenchMARL's mean episode reward of the collected batch, the mean of each training-loss term).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ALGOS = ("mappo", "ippo", "masac", "isac", "maddpg", "iddpg", "iql", "qmix", "vdn")
ON_POLICY = ("mappo", "ippo")


def patch_torchrl_for_benchmarl():
    """BenchMARL 1.5.2 targets TorchRL 0.10/0.11; its two breaks under 0.14.1, patched here.

    1. ``from torchrl.collectors import SyncDataCollector``: the class is ``Collector`` in 0.14.
    2. ``QValueModule(action_space=..., action_value_key=..., out_keys=..., spec=...)`` is given
       the agent group's composite action spec; 0.14.1's ``strict_shape=True`` default refuses
       it at construction. BenchMARL's value modules get ``strict_shape=False`` (0.11's check).
    """
    import torchrl.collectors
    import torchrl.modules

    if not hasattr(torchrl.collectors, "SyncDataCollector"):
        torchrl.collectors.SyncDataCollector = torchrl.collectors.Collector

    base = torchrl.modules.QValueModule

    class QValueModule(base):
        def __init__(self, *args, strict_shape=False, **kwargs):
            super().__init__(*args, strict_shape=strict_shape, **kwargs)

    torchrl.modules.QValueModule = QValueModule


def patch_losses(lib: str):
    """Put ``lib``'s classes into TorchRL's namespaces, with tools/torchrl_tests' swap table."""
    os.environ["RLLOSS_SWAP"] = "1" if lib == "rlloss" else "0"
    sys.path.insert(0, str(HERE.parent / "torchrl_tests"))
    import swap_plugin  # noqa: F401  (patches at import: the table TARGETS, rlloss's classes)
    import torchrl.objectives

    cls = torchrl.objectives.ClipPPOLoss
    want = "rlloss" if lib == "rlloss" else "torchrl"
    if not cls.__module__.startswith(want):
        raise RuntimeError(f"torchrl.objectives.ClipPPOLoss is {cls.__module__}, not {want}'s")
    return {name: f"{c.__module__}.{c.__qualname__}" for name, c in swap_plugin.ACTIVE.items()}


def parse_options(options):
    """``["n_agents=2", "alpha_init=0.2"]`` -> ``{"n_agents": 2, "alpha_init": 0.2}``."""
    parsed = {}
    for option in options:
        name, value = option.split("=", 1)
        try:
            parsed[name] = ast.literal_eval(value)  # 2, 0.5, True
        except (ValueError, SyntaxError):
            parsed[name] = value
    return parsed


def build_experiment(args, callbacks):
    import benchmarl.algorithms as algos
    from benchmarl.environments import VmasTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    config = ExperimentConfig.get_from_yaml()
    config.sampling_device = config.train_device = config.buffer_device = "cpu"
    config.loggers, config.create_json = [], False
    config.evaluation, config.render = False, False
    config.checkpoint_interval, config.checkpoint_at_end = 0, False
    config.save_folder = tempfile.mkdtemp(prefix="benchmarl_")
    config.max_n_frames = args.frames
    config.on_policy_collected_frames_per_batch = args.frames_per_batch
    config.off_policy_collected_frames_per_batch = args.frames_per_batch
    config.on_policy_n_envs_per_worker = config.off_policy_n_envs_per_worker = args.n_envs
    config.on_policy_n_minibatch_iters = args.minibatch_iters
    config.on_policy_minibatch_size = args.minibatch_size
    config.off_policy_n_optimizer_steps = args.optimizer_steps
    config.off_policy_train_batch_size = args.train_batch_size
    config.off_policy_init_random_frames = args.init_random_frames
    if args.memory_size is not None:
        config.off_policy_memory_size = args.memory_size
    if args.anneal_frames is not None:  # exploration annealing (default: max_n_frames / 3)
        config.exploration_anneal_frames = args.anneal_frames
    if args.lr is not None:
        config.lr = args.lr
    algo_cls = {a: getattr(algos, a.capitalize() + "Config") for a in ALGOS}[args.algo]
    algorithm = algo_cls.get_from_yaml()
    for name, value in parse_options(args.algo_option).items():  # e.g. alpha_init=0.2
        if not hasattr(algorithm, name):
            raise ValueError(f"--algo-option {name}: {args.algo}'s config has no such field")
        setattr(algorithm, name, value)
    task = getattr(VmasTask, args.task.upper()).get_from_yaml()
    task.config.update(parse_options(args.task_option))  # e.g. n_agents=2: a VMAS keyword
    model = MlpConfig.get_from_yaml()
    return Experiment(
        task=task,
        algorithm_config=algorithm,
        model_config=model,
        critic_model_config=MlpConfig.get_from_yaml(),
        seed=args.seed,
        config=config,
        callbacks=callbacks,
    )


def make_recorder(rows, flush=lambda: None):
    from benchmarl.experiment.callback import Callback

    class Recorder(Callback):
        """Per iteration: frames, BenchMARL's mean episode reward, mean of each loss term."""

        def on_batch_collected(self, batch):
            exp = self.experiment
            rows.append(
                {
                    "iter": exp.n_iters_performed,
                    "frames": exp.total_frames,
                    "reward": round(float(exp.mean_return), 4),
                    "t": time.time(),
                }
            )
            flush()  # a run cut by a time limit keeps the iterations it finished

        def on_train_end(self, training_td, group):
            for key, value in training_td.items():
                if key.startswith("loss"):
                    rows[-1][f"{group}/{key}"] = round(value.float().mean().item(), 5)

    # BenchMARL pickles its callbacks: the class must be reachable as a module attribute
    Recorder.__qualname__ = "Recorder"
    globals()["Recorder"] = Recorder
    return Recorder()


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", choices=("torchrl", "rlloss"), required=True)
    p.add_argument("--algo", choices=ALGOS, required=True)
    p.add_argument("--task", default="balance", help="VMAS task (VmasTask member), e.g. navigation")
    p.add_argument(
        "--task-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a key of the task's config (repeatable), e.g. n_agents=2",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frames", type=int, default=6000, help="max_n_frames")
    p.add_argument("--frames-per-batch", type=int, default=6000)
    p.add_argument("--n-envs", type=int, default=60, help="vectorised VMAS environments")
    p.add_argument("--minibatch-iters", type=int, default=45, help="on-policy epochs per batch")
    p.add_argument("--minibatch-size", type=int, default=400)
    p.add_argument("--optimizer-steps", type=int, default=1000, help="off-policy steps per batch")
    p.add_argument("--train-batch-size", type=int, default=128)
    p.add_argument("--init-random-frames", type=int, default=0, help="off-policy warm-up")
    p.add_argument("--memory-size", type=int, default=None, help="replay buffer (1e6 default)")
    p.add_argument("--anneal-frames", type=int, default=None, help="exploration annealing")
    p.add_argument(
        "--algo-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a field of the algorithm's config (repeatable), e.g. alpha_init=0.2",
    )
    p.add_argument("--lr", type=float, default=None, help="default: BenchMARL's 5e-5")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--tag", default="", help="appended to the output file's name")
    p.add_argument("--out", default=str(HERE / "results" / "raw"))
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    import torch

    torch.set_num_threads(args.threads)
    patch_torchrl_for_benchmarl()
    active = patch_losses(args.lib)
    rows, record = [], {"args": vars(args), "outcome": "running"}
    record["loss_classes"] = {k: v for k, v in active.items() if k.endswith("Loss")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{args.algo}_{args.task}_{args.lib}_s{args.seed}_{args.frames}{args.tag}.json"
    start = time.time()

    def flush():
        record["wall_s"] = round(time.time() - start, 1)
        record["rows"] = [{**row, "t": round(row["t"] - start, 1)} for row in rows]
        (out / name).write_text(json.dumps(record, indent=1))

    try:
        build_experiment(args, [make_recorder(rows, flush)]).run()
        record["outcome"] = "ok"
    except Exception:  # a crash is a result: record it with its traceback
        record["outcome"] = "crash"
        record["traceback"] = traceback.format_exc()
        print(record["traceback"], file=sys.stderr)
    flush()
    rewards = [r["reward"] for r in rows]
    print(f"{name}: {record['outcome']} {record['wall_s']}s rewards {rewards[:3]}...{rewards[-3:]}")
    return 0 if record["outcome"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
