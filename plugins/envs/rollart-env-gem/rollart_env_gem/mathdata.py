"""The small math set shipped for ``gem/math:local`` (GEM's own math sets download).

``python -m rollart_env_gem.mathdata`` regenerates ``data/math_mini.jsonl``: 64 seeded
grade-school word problems, ``{"problem", "answer"}`` per line, graded by GEM's MathEnv.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DATA = Path(__file__).with_name("data") / "math_mini.jsonl"

TEMPLATES = [
    ("{name} has {a} apples and buys {b} more. How many apples does {name} have now?",
     lambda a, b: a + b),
    ("A shelf holds {a} books. {name} takes away {b} of them. How many books are left?",
     lambda a, b: a - b),
    ("{name} packs {a} boxes with {b} pencils in each box. How many pencils is that in total?",
     lambda a, b: a * b),
    ("{name} shares {p} sweets equally among {b} friends. How many sweets does each friend get?",
     None),
    ("A train travels {a} km in the morning and {b} km in the afternoon. How far does it travel "
     "that day?", lambda a, b: a + b),
    ("{name} saves {a} dollars a week for {b} weeks. How many dollars has {name} saved?",
     lambda a, b: a * b),
    ("A rectangle is {a} cm long and {b} cm wide. What is its perimeter in cm?",
     lambda a, b: 2 * (a + b)),
    ("{name} reads {a} pages on Monday and twice as many on Tuesday. How many pages in both "
     "days?", lambda a, b: 3 * a),
]
NAMES = ["Ada", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana"]


def generate(n: int = 64, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        text, fn = TEMPLATES[i % len(TEMPLATES)]
        name = rng.choice(NAMES)
        a, b = rng.randint(12, 90), rng.randint(2, 11)
        if fn is None:  # division with a whole answer
            q = rng.randint(2, 12)
            rows.append({"problem": text.format(name=name, p=q * b, b=b), "answer": str(q)})
            continue
        rows.append({"problem": text.format(name=name, a=a, b=b), "answer": str(fn(a, b))})
    return rows


if __name__ == "__main__":
    DATA.write_text("".join(json.dumps(r) + "\n" for r in generate()))
    print(f"wrote {DATA}")
