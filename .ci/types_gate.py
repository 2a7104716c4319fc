"""The types gate's verdict on mypy's output (read on stdin), with a ratchet.

`.ci/types-pending` lists the files whose mypy errors are not enforced yet (one path a
line, `#` comments). Every error outside them fails the gate. A listed file that mypy
now finds clean fails it too, with the line to delete, so that a file typed once stays
typed: the list only shrinks. The pending files' errors are counted, not shown.

Usage: `bash .ci/lint types` runs every mypy run and hands the output here;
`bash .ci/lint types-list` prints the files with errors in the list's format, with their
error counts (`--list`), to write the list once.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# `path:line: error: ...`, `path:line:col: note: ...`, `path: error: ...`
MESSAGE = re.compile(r"^(?P<path>[^:\s][^:]*?)(?::\d+)*: (?P<kind>error|note|warning): ")
# A blocking error (a syntax error, a duplicate module) stops mypy before the other files
# are checked: the run proves nothing, whichever file it is in.
BLOCKED = "errors prevented further checking"
RUN_MARK = "### mypy run:"  # .ci/lint's line before each run's output


@dataclass
class Verdict:
    enforced: list[str] = field(default_factory=list)  # errors and their notes
    failures: int = 0  # errors among them
    pending: Counter[str] = field(default_factory=Counter)  # pending path → errors
    now_clean: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # listed, no such file
    blocked: bool = False

    @property
    def passed(self) -> bool:
        return not (self.failures or self.now_clean or self.missing or self.blocked)


def read_pending(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def judge(output: str, pending: list[str], exists=lambda path: Path(path).is_file()) -> Verdict:
    """Sort mypy's lines into enforced failures and pending counts (pure: `exists` is
    the only look at the disk)."""
    verdict = Verdict()
    listed = set(pending)
    for line in output.splitlines():
        if BLOCKED in line:
            verdict.blocked = True
        match = MESSAGE.match(line)
        if not match:
            continue
        if match["path"] not in listed:
            verdict.enforced.append(line)
            verdict.failures += match["kind"] == "error"
    verdict.pending = Counter(
        {path: n for path, n in error_counts(output).items() if path in listed}
    )
    verdict.missing = [path for path in pending if not exists(path)]
    verdict.now_clean = [path for path in pending if exists(path) and verdict.pending[path] == 0]
    return verdict


def report(verdict: Verdict) -> str:
    lines = list(verdict.enforced)
    if verdict.blocked:
        lines.append("types: mypy stopped at a blocking error: the other files went unchecked")
    for path in verdict.now_clean:
        lines.append(
            f"types: {path} now passes: delete its line from .ci/types-pending "
            "(the gate then holds it)"
        )
    for path in verdict.missing:
        lines.append(f"types: .ci/types-pending lists {path}, which does not exist")
    total = sum(verdict.pending.values())
    lines.append(
        f"types: {verdict.failures} enforced error(s); pending: {total} "
        f"error(s) in {len(verdict.pending)} file(s) not enforced yet "
        "(.ci/types-pending)"
    )
    return "\n".join(lines)


def error_counts(output: str) -> Counter[str]:
    """Path → mypy errors in it: the most any one run found (trident_common is checked
    by the first run and again by each engine folder's strict run)."""
    worst: Counter[str] = Counter()
    for run in output.split(RUN_MARK):
        found = Counter(
            match["path"]
            for line in run.splitlines()
            if (match := MESSAGE.match(line)) and match["kind"] == "error"
        )
        worst |= found  # Counter union: the larger count of each path
    return worst


def main(argv: list[str]) -> int:
    if argv[1] == "--list":
        counts = error_counts(sys.stdin.read())
        print("\n".join(f"{path}  # {n}" for path, n in sorted(counts.items())))
        return 0
    pending = read_pending(Path(argv[1]).read_text())
    verdict = judge(sys.stdin.read(), pending)
    print(report(verdict))
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
