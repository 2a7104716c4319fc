"""The guard every command that (re)places a directory goes through.

trident replaces a directory only when it wrote it itself: each render leaves a marker
file (MARKER, holding the spec's digest) at the top of the repository. Anything else at
the target (a user's folder, a file, the spec or a folder holding it) is refused with
one line, exit 2, before anything is written.

Temporary siblings carry the writing process's PID in their names
(`.NAME.rendering-PID-xxxx`, `.NAME.old-PID`), so a later run can tell the leftovers of
a killed process from the work of a live one and remove them.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from builder.errors import EXIT_USAGE, TridentError, printable
from builder.spec.yaml_loader import MAX_BYTES

MARKER = ".trident-repository"


class OutputDirError(TridentError):
    """The output path is not one trident may write: `PATH: reason`."""

    exit_code = EXIT_USAGE


def marker_text(spec_file: str) -> bytes:
    """The marker's content: what wrote the directory, and from which spec bytes."""
    try:
        with open(spec_file, "rb") as f:  # capped: the spec was read with the same cap
            digest = hashlib.sha256(f.read(MAX_BYTES)).hexdigest()
    except OSError:
        digest = "none"  # a spec given as data (tests, the API): no file to digest
    return (
        f"trident model repository; `trident repo` may replace this directory.\n"
        f"spec-sha256: {digest}\n"
    ).encode()


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_target(out: Path, protect: Iterable[str | Path] = ()) -> Path:
    """out as an absolute, resolved path, if trident may (re)place a directory there.

    protect: paths that must survive (the spec): out may be neither one of them nor a
    folder holding one.
    """
    shown = printable(str(out))
    target = Path(out).expanduser().absolute()
    resolved = target.resolve()
    for path in protect:
        kept = Path(path).expanduser().absolute().resolve()
        if _inside(kept, resolved):
            what = "is" if kept == resolved else "holds"
            raise OutputDirError(
                f"{shown}: {what} the spec {printable(str(path))}; choose another output directory"
            )
    if target.is_symlink():
        raise OutputDirError(f"{shown}: is a symbolic link; give the real directory")
    if target.exists() and not target.is_dir():
        raise OutputDirError(f"{shown}: exists and is not a directory; trident will not replace it")
    if target.is_dir() and not is_ours(target) and _has_entries(target):
        raise OutputDirError(
            f"{shown}: exists and was not written by trident (no {MARKER}); "
            "refusing to replace it (remove it or choose another --out)"
        )
    return target


def check_file_target(out: Path, protect: Iterable[str | Path], header: str) -> Path:
    """The same guard for a command that writes one file (`trident mig plan --out`): not
    a protected path (the spec, its topology file), not a directory or a link, and an
    existing file only if trident wrote it (its first line starts with `header`)."""
    shown = printable(str(out))
    target = Path(out).expanduser().absolute()
    for path in protect:
        if Path(path).expanduser().absolute().resolve() == target.resolve():
            raise OutputDirError(
                f"{shown}: is the spec's file {printable(str(path))}; choose another output file"
            )
    if target.is_symlink():
        raise OutputDirError(f"{shown}: is a symbolic link; give the real file")
    if target.is_dir():
        raise OutputDirError(f"{shown}: is a directory; give a file name")
    if target.exists():
        if not target.is_file() or not _starts_with(target, header.encode()):
            raise OutputDirError(
                f"{shown}: exists and was not written by trident; "
                "refusing to replace it (remove it or choose another --out)"
            )
    return target


def _starts_with(path: Path, prefix: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(prefix)) == prefix
    except OSError:
        return False


def is_ours(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def _has_entries(folder: Path) -> bool:
    with os.scandir(folder) as entries:
        return any(True for _ in entries)


def temp_prefix(target: Path, kind: str) -> str:
    return f".{target.name}.{kind}-{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is just not ours to signal
    return True


def clean_stale(target: Path) -> list[Path]:
    """Remove the temporary siblings of target left by processes that no longer run."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(?:rendering|old)-(\d+)-")
    removed: list[Path] = []
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return removed  # no parent yet, or unreadable: nothing of ours can be there
    for sibling in siblings:
        match = pattern.match(sibling.name)
        if match and int(match.group(1)) != os.getpid() and not _pid_alive(int(match.group(1))):
            shutil.rmtree(sibling, ignore_errors=True)
            removed.append(sibling)
    return removed


def make_parents(target: Path) -> list[Path]:
    """Create target's missing parents; returns the ones created (deepest last), so a
    failed render can remove them again."""
    missing = [p for p in reversed(target.parents) if not p.exists()]
    for folder in missing:
        folder.mkdir()
    return missing


def remove_created(folders: list[Path]) -> None:
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty any more (someone else wrote there): theirs to keep
