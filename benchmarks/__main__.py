"""``python -m benchmarks``: run a benchmark, list them, compare two stored results, regenerate the docs' tables.

    python -m benchmarks list
    python -m benchmarks NAME [--rounds 3] [--models mlp cnn] [--batches 25 256] [--epochs 3] [--set key=value]
    python -m benchmarks compare OLD.json NEW.json
    python -m benchmarks docs [--check]

Run from the project root, on an otherwise idle machine.
"""

from __future__ import annotations

import sys

from benchmarks import docs, harness, results
from tfdist.errors import TfdistError


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "list":
        for name in harness.benchmark_names():
            stores, title = harness.describe(name)
            print(f"{name:<20} {'stores results' if stores else 'script':<15} {title}")
        return 0
    if command == "compare":
        if len(rest) != 2:
            print("usage: python -m benchmarks compare OLD.json NEW.json", file=sys.stderr)
            return 2
        print(results.compare(results.read(rest[0]), results.read(rest[1])))
        return 0
    if command == "docs":
        if rest == ["--check"]:
            stale = docs.stale()
            for line in stale:
                print(f"stale: {line}; run python -m benchmarks docs", file=sys.stderr)
            return 1 if stale else 0
        changed = [page for page in docs.pages() if docs.update(page)]
        print("\n".join(f"rewrote {page.relative_to(docs.REPO)}" for page in changed) or "every table is current")
        return 0
    try:
        harness.run(command, rest)
    except TfdistError as err:  # a missing prepared split, a bad setting: one line, as the stages say it
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
