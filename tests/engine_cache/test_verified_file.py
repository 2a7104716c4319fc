"""VerifyingFile: the sha256 of a file written out of order, computed while it is written."""

from __future__ import annotations

import hashlib
import os
import random

from engine_cache.verified_file import VerifyingFile, WrittenPrefix


def test_prefix_grows_only_without_gaps():
    prefix = WrittenPrefix()
    assert prefix.add(10, 5) == 0  # beyond a gap: not yet part of the prefix
    assert prefix.add(20, 5) == 0
    assert prefix.add(0, 10) == 15  # fills the gap, absorbs 10..15
    assert prefix.add(15, 3) == 18  # 20..25 still waits for 18..20
    assert prefix.add(16, 10) == 26  # overlapping rewrite (a retried part)
    assert prefix.add(0, 4) == 26  # rewrites behind the prefix change nothing


def _write_parts(path, data: bytes, part: int, order):
    target = VerifyingFile(path)
    for index in order:
        target.seek(index * part)
        target.write(data[index * part : (index + 1) * part])
    target.close()
    return target


def test_out_of_order_parts_give_the_file_hash(tmp_path):
    data = os.urandom(3 * (1 << 20) + 12345)
    part = 256 * 1024
    order = list(range(-(-len(data) // part)))
    random.Random(7).shuffle(order)
    target = _write_parts(tmp_path / "f", data, part, order)
    assert target.size() == len(data)
    assert target.digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "f").read_bytes() == data


def test_a_missing_part_leaves_the_hash_short(tmp_path):
    data = os.urandom(10 * 1000)
    target = _write_parts(tmp_path / "f", data, 1000, [0, 1, 2, 4, 5, 6, 7, 8, 9])
    assert target.size() == 3000  # everything after the gap is unverified
    assert target.digest.hexdigest() == hashlib.sha256(data[:3000]).hexdigest()
