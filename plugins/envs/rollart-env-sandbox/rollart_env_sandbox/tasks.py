"""The shipped task set: tiny Python repositories, each with a bug and a failing test.

``python -m rollart_env_sandbox.tasks`` regenerates ``data/tasks.json`` (deterministic);
the tests check the shipped file matches and that every task fails as shipped and passes
with its reference fix, run in the sandbox.

A task is ``{"id", "issue", "files": {path: text}, "fix": {path: text}}``; the test
command is ``python -m unittest`` in the repository root.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("data") / "tasks.json"

# (function name, issue, buggy body, fixed body, test assertions)
TEMPLATES: list[tuple[str, str, str, str, list[str]]] = [
    ("add", "add(a, b) should return the sum of a and b, but it subtracts.",
     "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n",
     ["add(2, 3) == 5", "add(-1, 1) == 0", "add(0, 0) == 0"]),
    ("is_even", "is_even(n) returns True for odd numbers instead of even ones.",
     "def is_even(n):\n    return n % 2 == 1\n", "def is_even(n):\n    return n % 2 == 0\n",
     ["is_even(4) is True", "is_even(7) is False", "is_even(0) is True"]),
    ("clamp", "clamp(x, lo, hi) should limit x to the range [lo, hi]; it returns the wrong bound.",
     "def clamp(x, lo, hi):\n    return min(lo, max(x, hi))\n",
     "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
     ["clamp(5, 0, 10) == 5", "clamp(-3, 0, 10) == 0", "clamp(42, 0, 10) == 10"]),
    ("factorial", "factorial(n) is off by one: factorial(5) should be 120.",
     "def factorial(n):\n    out = 1\n    for i in range(1, n):\n        out *= i\n    return out\n",
     "def factorial(n):\n    out = 1\n    for i in range(1, n + 1):\n        out *= i\n    return out\n",
     ["factorial(0) == 1", "factorial(1) == 1", "factorial(5) == 120"]),
    ("reverse_words", "reverse_words(s) should reverse the order of words, not the characters.",
     "def reverse_words(s):\n    return s[::-1]\n",
     "def reverse_words(s):\n    return ' '.join(reversed(s.split()))\n",
     ["reverse_words('a b c') == 'c b a'", "reverse_words('hello world') == 'world hello'"]),
    ("count_vowels", "count_vowels(s) ignores upper-case vowels.",
     "def count_vowels(s):\n    return sum(1 for ch in s if ch in 'aeiou')\n",
     "def count_vowels(s):\n    return sum(1 for ch in s.lower() if ch in 'aeiou')\n",
     ["count_vowels('banana') == 3", "count_vowels('AEIOU') == 5", "count_vowels('xyz') == 0"]),
    ("fizzbuzz", "fizzbuzz(15) should be 'FizzBuzz' but returns 'Fizz'.",
     "def fizzbuzz(n):\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n"
     "        return 'Buzz'\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    return str(n)\n",
     "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n"
     "        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)\n",
     ["fizzbuzz(3) == 'Fizz'", "fizzbuzz(10) == 'Buzz'", "fizzbuzz(15) == 'FizzBuzz'",
      "fizzbuzz(7) == '7'"]),
    ("mean", "mean(xs) divides by the wrong count.",
     "def mean(xs):\n    return sum(xs) / (len(xs) - 1)\n",
     "def mean(xs):\n    return sum(xs) / len(xs)\n",
     ["mean([1, 2, 3]) == 2", "mean([4]) == 4", "mean([0, 10]) == 5"]),
    ("is_palindrome", "is_palindrome(s) should ignore case: 'Level' is a palindrome.",
     "def is_palindrome(s):\n    return s == s[::-1]\n",
     "def is_palindrome(s):\n    s = s.lower()\n    return s == s[::-1]\n",
     ["is_palindrome('Level') is True", "is_palindrome('abc') is False", "is_palindrome('') is True"]),
    ("argmax", "argmax(xs) returns the index of the smallest element, not the largest.",
     "def argmax(xs):\n    best = 0\n    for i, x in enumerate(xs):\n        if x < xs[best]:\n"
     "            best = i\n    return best\n",
     "def argmax(xs):\n    best = 0\n    for i, x in enumerate(xs):\n        if x > xs[best]:\n"
     "            best = i\n    return best\n",
     ["argmax([1, 9, 3]) == 1", "argmax([5]) == 0", "argmax([2, 1, 7, 7]) == 2"]),
    ("to_fahrenheit", "to_fahrenheit(c) uses the wrong factor: 100 C is 212 F.",
     "def to_fahrenheit(c):\n    return c * 5 / 9 + 32\n",
     "def to_fahrenheit(c):\n    return c * 9 / 5 + 32\n",
     ["to_fahrenheit(0) == 32", "to_fahrenheit(100) == 212", "to_fahrenheit(-40) == -40"]),
    ("dedupe", "dedupe(xs) must keep the first occurrence order, but the order is lost.",
     "def dedupe(xs):\n    return sorted(set(xs), key=str)\n",
     "def dedupe(xs):\n    return list(dict.fromkeys(xs))\n",
     ["dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]", "dedupe([]) == []", "dedupe(['b', 'a', 'b']) == ['b', 'a']"]),
]
MODULES = ("utils", "helpers")


def make_task(index: int, module: str, template: tuple[str, str, str, str, list[str]]) -> dict[str, Any]:
    name, issue, buggy, fixed, checks = template
    tests = [f"from {module} import {name}", "import unittest", "", "",
             f"class Test{name.title().replace('_', '')}(unittest.TestCase):"]
    for i, check in enumerate(checks):
        tests += [f"    def test_{i}(self):", f"        self.assertTrue({check}, {check!r})", ""]
    tests += ["", "if __name__ == '__main__':", "    unittest.main()", ""]
    return {
        "id": f"{name}-{module}",
        "issue": f"Bug report: {issue} The function is {name} in {module}.py; "
                 f"the tests in test_{module}.py show the expected behaviour.",
        "files": {f"{module}.py": buggy, f"test_{module}.py": "\n".join(tests)},
        "fix": {f"{module}.py": fixed},
        "index": index,
    }


def generate() -> list[dict[str, Any]]:
    return [make_task(len(MODULES) * i + j, module, t)
            for i, t in enumerate(TEMPLATES) for j, module in enumerate(MODULES)]


def load_tasks(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The shipped tasks, or a JSON list of tasks in the same format at ``path``."""
    source = Path(path) if path else DATA
    tasks = json.loads(source.read_text())
    for i, t in enumerate(tasks):
        missing = {"id", "issue", "files"} - set(t)
        if missing:
            raise ValueError(f"{source}: task {i} lacks {sorted(missing)}")
    return tasks


if __name__ == "__main__":
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(generate(), indent=1) + "\n")
    print(f"wrote {len(generate())} tasks to {DATA}", file=sys.stderr)
