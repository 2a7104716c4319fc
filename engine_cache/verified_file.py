"""A download target that is verified while it is written.

s3transfer writes a seekable target at each part's offset, in whatever order the parallel
ranged GETs finish (boto3's own fastest path). A hasher thread follows the contiguous written
prefix and hashes it by reading it back from the page cache, so the sha256 of every byte is
known when the last part lands, with no second pass and no parts held in memory.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

READ_BACK_BYTES = 8 << 20


class WrittenPrefix:
    """Tracks how far from offset 0 a file is written without gaps (pure, thread-unsafe)."""

    def __init__(self):
        self.end = 0
        self._ahead: dict[int, int] = {}  # start → end of writes beyond a gap

    def add(self, start: int, length: int) -> int:
        """Record a write; returns the new end of the gap-free prefix."""
        stop = start + length
        if start > self.end:
            self._ahead[start] = max(self._ahead.get(start, start), stop)
            return self.end
        self.end = max(self.end, stop)
        absorbed = True
        while absorbed:  # writes that the prefix now reaches
            absorbed = False
            for ahead_start in [s for s in self._ahead if s <= self.end]:
                self.end = max(self.end, self._ahead.pop(ahead_start))
                absorbed = True
        return self.end


class VerifyingFile:
    """Seekable, write-only file object for s3transfer; digest is final after close()."""

    def __init__(self, path: Path):
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._position = 0
        self._prefix = WrittenPrefix()
        self._changed = threading.Condition()
        self._closing = False
        self.digest = hashlib.sha256()
        self.hashed = 0  # bytes hashed so far (the gap-free prefix)
        self.read_error: OSError | None = None  # a local disk failure, not a bad download
        self._hasher = threading.Thread(target=self._hash_prefix, daemon=True, name="sha256-verify")
        self._hasher.start()

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET:
            raise OSError("VerifyingFile supports absolute seeks only")
        self._position = offset
        return offset

    def tell(self) -> int:
        return self._position

    def write(self, data: bytes) -> int:
        view, start = memoryview(data), self._position
        while view:
            written = os.pwrite(self._fd, view, self._position)
            self._position += written
            view = view[written:]
        with self._changed:
            self._prefix.add(start, self._position - start)
            self._changed.notify()
        return len(data)

    def _hash_prefix(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._prefix.end > self.hashed or self._closing)
                end = self._prefix.end
                if end <= self.hashed:
                    return  # closing and everything written is hashed
            while self.hashed < end:
                try:
                    chunk = os.pread(self._fd, min(READ_BACK_BYTES, end - self.hashed), self.hashed)
                except OSError as e:
                    self.read_error = e
                    return
                if not chunk:
                    return
                self.digest.update(chunk)
                self.hashed += len(chunk)

    def close(self) -> None:
        """Wait for the hasher to finish the gap-free prefix, then close the file."""
        if self._fd < 0:
            return
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._hasher.join()
        os.close(self._fd)
        self._fd = -1

    def size(self) -> int:
        """Bytes in the file's gap-free prefix, all of them hashed (valid after close)."""
        return self.hashed
