"""Bad-input catalogue cases per class, from pytest's collection of the catalogue files.

    PYTHONPATH=$PWD python tools/catalogue_counts.py [test files...]

Each case's class is read from its id: the subject (``BCLoss-chunks-...``), a constructor or
assignment row (``GAIL-gp_lambda-neg``) or, for ids without one, the test's name
(``test_mc_advantage_...``). Prints a Markdown table, the classes in the order met.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

DEFAULT = ["tests/test_bad_inputs_new_classes.py", "tests/test_bad_inputs_llm.py"]
ALIASES = {  # a row's short prefix -> the class
    "BC": "BCLoss",
    "DiffusionBC": "DiffusionBCLoss",
    "ACT": "ACTLoss",
    "GAIL": "GAILLoss",
    "DT": "DTLoss",
    "OnlineDT": "OnlineDTLoss",
    "RND": "RNDLoss",
    "MAPPO": "MAPPOLoss",
    "IPPO": "IPPOLoss",
    "QMixer": "QMixerLoss",
    "DreamerModel": "DreamerModelLoss",
    "DreamerActor": "DreamerActorLoss",
    "DreamerValue": "DreamerValueLoss",
    "DreamerV3Model": "DreamerV3ModelLoss",
    "DreamerV3Value": "DreamerV3ValueLoss",
    "DreamerV3Actor": "DreamerV3ActorLoss",
    "DreamerV3": "DreamerV3Loss",
    "WorldModel": "WorldModelLoss",
    "PILCO": "ExponentialQuadraticCost",
    "SFT": "SFTLoss",
    "Distillation": "DistillationLoss",
}
BY_TEST = {
    "mc_advantage_selector": "MCAdvantageSelector",
    "mc_advantage": "MCAdvantage",
    "qmixer": "QMixerLoss",
    "mappo_value_norm": "MAPPOLoss",
    "world_model_loss": "WorldModelLoss",
    "rnd_observation": "RNDLoss",
    "lambda_continue": "DreamerV3ModelLoss",
    "pilco": "ExponentialQuadraticCost",
}


def class_of(test: str, ident: str) -> str:
    for fragment, name in BY_TEST.items():
        if fragment in test:
            return name
    head = re.split(r"[-\[]", ident, maxsplit=1)[0]
    return ALIASES.get(head, head)


def main(files: list[str]) -> None:
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: Counter = Counter()
    for line in collected.splitlines():
        match = re.match(r"\S+::(\w+)(?:\[(.*)\])?$", line)
        if match:
            counts[class_of(match[1], match[2] or "")] += 1
    print("| class | cases |\n|---|---|")
    for name, count in counts.items():
        print(f"| {name} | {count} |")
    print(f"| total | {sum(counts.values())} |")


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
