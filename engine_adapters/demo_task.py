"""The demo model's checkable task: repeat a list of words.

The demo model is trained on this task (so a quality figure measures something), and the same
examples, from another seed, are the local lm-eval task that scores it. One definition serves both:
the training script receives its examples from here, and the lm-eval task is written from here.

An example is ``repeat: fox dog lazy =>`` answered `` fox dog lazy.``: exact answers, so exact
match is the score, and a generation stops at the period.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

WORDS: tuple[str, ...] = (
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
    "def", "return", "x", "f", "one", "two", "three", "four",
)
"""Words of the demo tokenizer's own corpus, so each is one or two tokens."""

PROMPT_PREFIX = "repeat:"
PROMPT_SUFFIX = " =>"
ANSWER_END = "."
EXAMPLE_SEPARATOR = "\n"
"""Between examples packed in one training sequence: after its answer the model goes on with the
next example, so a generation past the answer (``ignore_eos``) stays in the task's format."""
MIN_WORDS = 2
MAX_WORDS = 6

Split = Literal["train", "test"]
_SPLIT_SEED: dict[str, int] = {"train": 1, "test": 2}
"""Different streams per split, so the test examples are not the training ones by construction of
the seed (a few short lists can still coincide: the task space is small)."""


@dataclass(frozen=True)
class TaskExample:
    prompt: str
    answer: str
    """The exact expected continuation, starting with its space and ending with ``ANSWER_END``."""


def example_for(words: list[str]) -> TaskExample:
    listed = " ".join(words)
    return TaskExample(prompt=f"{PROMPT_PREFIX} {listed}{PROMPT_SUFFIX}", answer=f" {listed}{ANSWER_END}")


def examples(count: int, split: Split = "test", seed: int = 0) -> list[TaskExample]:
    """``count`` deterministic examples of one split (the same list for the same arguments)."""
    rng = random.Random(_SPLIT_SEED[split] * 1_000_003 + seed)
    out: list[TaskExample] = []
    for _ in range(count):
        length = rng.randint(MIN_WORDS, MAX_WORDS)
        out.append(example_for([rng.choice(WORDS) for _ in range(length)]))
    return out


def is_correct(example: TaskExample, completion: str) -> bool:
    """Exact match of the completion up to and including the first ``ANSWER_END``."""
    end = completion.find(ANSWER_END)
    answer = completion if end < 0 else completion[: end + len(ANSWER_END)]
    return answer.strip() == example.answer.strip()
