"""Writes the sample traces shipped in ``assets/traces/``: generated, seeded, small enough for the
CPU demo engine (prompts of at most 2,560 tokens), one per format that ``app.load.traces`` reads.

    .venv/bin/python tests/data/make_trace_samples.py

They are not recordings of real traffic. The Mooncake sample has its structure: applications
whose requests share a system prompt of whole 512-token blocks, and conversations whose turns
resend the previous turns' blocks. A test checks the shipped files are what this writes.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta
from pathlib import Path

TRACES = Path(__file__).resolve().parent.parent.parent / "assets" / "traces"
BLOCK = 512


def mooncake_lines(seed: int = 2026, requests: int = 40) -> list[str]:
    rng = random.Random(seed)
    next_id = iter(range(10_000))
    system = [[next(next_id) for _ in range(n)] for n in (1, 2, 1)]  # three applications' system prompts
    conversations: list[tuple[int, list[int]]] = []  # (application, full blocks so far)
    lines, t_ms = [], 0
    for _ in range(requests):
        t_ms += int(rng.expovariate(1 / 400)) + 20
        if conversations and rng.random() < 0.5:  # a next turn: the history resent, one block more
            k = rng.randrange(len(conversations))
            app, history = conversations[k]
        else:
            app = rng.randrange(len(system))
            history = list(system[app])
            conversations.append((app, history))
            k = len(conversations) - 1
        if len(history) >= 4:  # long enough for the demo model: the conversation ends here
            history = list(system[app])
            conversations[k] = (app, history)
        tail = rng.randint(64, BLOCK - 1)  # the new turn: a partial block of its own
        hash_ids = [*history, next(next_id)]
        lines.append(json.dumps({"timestamp": t_ms, "input_length": len(history) * BLOCK + tail,
                                 "output_length": rng.randint(8, 32), "hash_ids": hash_ids}))
        conversations[k] = (app, [*history, next(next_id)])  # its last block, now whole, and new again
    return lines


def azure_lines(seed: int = 2023, requests: int = 40) -> list[str]:
    rng = random.Random(seed)
    t = datetime(2023, 11, 16, 18, 15, 46, 680590)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for _ in range(requests):
        t += timedelta(seconds=rng.expovariate(2.5))
        stamp = t.strftime("%Y-%m-%d %H:%M:%S.%f") + "0"  # seven digits, as the Azure traces write them
        lines.append(f"{stamp},{rng.randint(64, 1500)},{rng.randint(8, 64)}")
    return lines


def tunebench_lines(seed: int = 7, requests: int = 30) -> list[str]:
    """Questions over two shared documents (three blocks each), each with a question of its own."""
    rng = random.Random(seed)
    documents = [[1, 2, 3], [4, 5, 6]]
    lines, at_s = [], 0.0
    for n in range(requests):
        at_s += rng.expovariate(3.0)
        document = documents[rng.randrange(2)]
        question = rng.randint(32, BLOCK - 1)
        lines.append(json.dumps({"at_s": round(at_s, 3), "input_tokens": len(document) * BLOCK + question,
                                 "output_tokens": rng.randint(8, 32), "blocks": [*document, 100 + n]}))
    return lines


SAMPLES = {"mooncake-sample.jsonl": mooncake_lines, "azure-sample.csv": azure_lines,
           "tunebench-sample.jsonl": tunebench_lines}


def main() -> None:
    TRACES.mkdir(parents=True, exist_ok=True)
    for name, make in SAMPLES.items():
        (TRACES / name).write_text("\n".join(make()) + "\n", encoding="utf-8")
        print(f"wrote {TRACES / name}")


if __name__ == "__main__":
    main()
