"""Rendered files → a model repository on disk, atomically.

The files go into a temporary sibling directory, are validated, and only then swap into
place, so a failed render never leaves a half-written repository behind; the output
guard (builder.render.output_dir) makes sure only a directory trident wrote is replaced.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from builder.errors import printable
from builder.render import output_dir
from builder.render.context import RenderError


def write_repository(
    files: Mapping[str, bytes],
    out_dir: Path,
    validate: Callable[[Path], list[str]],
    spec_file: str | None = None,
) -> None:
    """Write into a temp dir beside out_dir, validate, then swap it in.

    out_dir must pass output_dir.check_target (absent, empty, or written by trident; not
    the spec nor a folder holding it). The swap is two renames on one filesystem: the old
    repository (if any) moves aside, the new one moves in, the old one is removed; signals
    wait until both renames are done. A failure before that leaves out_dir as it was (or
    absent), removes the temp dir and any parent folders this call created.
    """
    protect = [spec_file] if spec_file else []
    out_dir = output_dir.check_target(Path(out_dir), protect)
    output_dir.clean_stale(out_dir)
    files = {**files, output_dir.MARKER: output_dir.marker_text(spec_file or "")}
    created: list[Path] = []
    tmp = None
    try:
        created = output_dir.make_parents(out_dir)
        tmp = Path(
            tempfile.mkdtemp(
                prefix=output_dir.temp_prefix(out_dir, "rendering"), dir=out_dir.parent
            )
        )
        _write_files(tmp, files)
        problems = validate(tmp)
        if problems:
            raise RenderError("rendered repository is invalid:\n  " + "\n  ".join(problems))
        _swap(tmp, out_dir)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        output_dir.remove_created(created)
        if isinstance(e, OSError):
            raise RenderError(
                f"{printable(str(out_dir))}: cannot write the repository: {e.strerror or e}"
            ) from None
        raise


def _write_files(root: Path, files: Mapping[str, bytes]) -> None:
    for rel, data in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _swap(new: Path, out_dir: Path) -> None:
    """new replaces out_dir; SIGINT/SIGTERM are held back between the two renames, so an
    interrupted swap never leaves out_dir missing."""
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    old = None
    try:
        if out_dir.exists():
            old = out_dir.parent / (output_dir.temp_prefix(out_dir, "old") + "swap")
            os.rename(out_dir, old)
        os.rename(new, out_dir)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
