"""The local tier of EngineCache (no S3): build once, hits, damage, verify, gc, stats."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from engine_cache import CacheError, EngineCache, EngineInputs, engine_key
from engine_cache.local import stat_stamp
from tests.helpers.engine_cache import FakeClock, builds, recording_build

KEY = engine_key(EngineInputs("a" * 64, {"max_batch_size": 8}, "90", "0.20.0", "10.10.0"))
OTHER = engine_key(EngineInputs("b" * 64, {"max_batch_size": 8}, "90", "0.20.0", "10.10.0"))


def test_miss_builds_then_hits_locally(tmp_path):
    cache = EngineCache(tmp_path / "cache")
    log = tmp_path / "builds.log"
    assert cache.lookup(KEY) is None
    path, outcome = cache.get_or_build(KEY, recording_build(log), {"profile": "short"})
    assert outcome == "built" and builds(log) == 1
    assert (path / "rank0.engine").read_bytes() == b"ENGINE" * 100

    again, outcome = EngineCache(tmp_path / "cache").get_or_build(KEY, recording_build(log), {})
    assert (again, outcome) == (path, "hit-local") and builds(log) == 1
    assert cache.lookup(KEY) == path

    stats = cache.stats()
    assert (stats["builds"], stats["hits_local"], stats["misses"]) == (1, 2, 2)
    assert stats["lookups"] == 4 and stats["local_entries"] == 1
    assert (
        stats["local_bytes"]
        == (path / "rank0.engine").stat().st_size + (path / "config.json").stat().st_size
    )
    [entry] = cache.entries()
    assert (entry.key, entry.files, entry.tier, entry.metadata) == (
        KEY,
        2,
        "local",
        {"profile": "short"},
    )


def test_failed_build_leaves_no_entry(tmp_path):
    cache = EngineCache(tmp_path / "cache")

    def broken(out: Path):
        (out / "rank0.engine").write_bytes(b"half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        cache.get_or_build(KEY, broken, {})
    assert cache.lookup(KEY) is None and cache.entries() == []
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []
    assert cache.stats()["build_failures"] == 1


def test_build_that_writes_nothing_is_an_error(tmp_path):
    with pytest.raises(CacheError, match="holds no files"):
        EngineCache(tmp_path / "cache").get_or_build(KEY, lambda out: None, {})


def test_damaged_local_file_is_quarantined_and_rebuilt(tmp_path):
    cache = EngineCache(tmp_path / "cache")
    log = tmp_path / "builds.log"
    path, _ = cache.get_or_build(KEY, recording_build(log), {})
    engine = path / "rank0.engine"
    data = bytearray(engine.read_bytes())
    data[10] ^= 0xFF
    engine.write_bytes(bytes(data))  # same size, new mtime: rehashed on lookup

    assert cache.lookup(KEY) is None
    [quarantined] = (tmp_path / "cache" / "quarantine").iterdir()
    assert "sha256 differs" in (quarantined / "reason.txt").read_text()
    path, outcome = cache.get_or_build(KEY, recording_build(log), {})
    assert outcome == "built" and builds(log) == 2
    assert (path / "rank0.engine").read_bytes() == b"ENGINE" * 100


def test_truncated_local_file_is_never_served(tmp_path):
    cache = EngineCache(tmp_path / "cache")
    path, _ = cache.get_or_build(KEY, recording_build(tmp_path / "log"), {})
    with open(path / "rank0.engine", "r+b") as handle:
        handle.truncate(7)
    assert cache.lookup(KEY) is None


def _flip_first_byte(path: Path) -> None:
    with open(path, "r+b") as handle:
        first = handle.read(1)[0]
        handle.seek(0)
        handle.write(bytes([first ^ 1]))


def test_a_write_that_restores_the_mtime_is_still_noticed(tmp_path):
    cache = EngineCache(tmp_path / "cache")
    path, _ = cache.get_or_build(KEY, recording_build(tmp_path / "log"), {})
    engine = path / "rank0.engine"
    stat = engine.stat()
    _flip_first_byte(engine)
    os.utime(engine, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert cache.lookup(KEY) is None, "the ctime gives the write away"


def test_verify_rehashes_what_lookups_trust(tmp_path):
    """Bit rot changes no stat field; simulated by re-stamping the entry after a write."""
    cache = EngineCache(tmp_path / "cache")
    path, _ = cache.get_or_build(KEY, recording_build(tmp_path / "log"), {})
    cache.get_or_build(OTHER, recording_build(tmp_path / "log"), {})
    assert cache.verify() == []
    _flip_first_byte(path / "rank0.engine")
    manifest = cache.local.manifest(KEY)
    (cache.local.entry_dir(KEY) / "stamp.json").write_text(json.dumps(stat_stamp(path, manifest)))
    assert cache.lookup(KEY) == path, "lookups trust an unchanged stat identity"
    problems = cache.verify()
    assert problems == [f"local {KEY}: rank0.engine: sha256 differs from the manifest"]
    assert [e.key for e in cache.entries()] == [OTHER]
    assert cache.stats()["corrupt_entries"] == 1


def test_publish_copies_a_directory(tmp_path):
    source = tmp_path / "built"
    (source / "sub").mkdir(parents=True)
    (source / "rank0.engine").write_bytes(b"x" * 10)
    (source / "sub" / "tokenizer.json").write_text("{}")
    cache = EngineCache(tmp_path / "cache")
    cache.publish(KEY, source, {"by": "test"})
    path = cache.lookup(KEY)
    assert (path / "sub" / "tokenizer.json").read_text() == "{}"
    assert source.exists(), "the caller's directory is left alone"
    with pytest.raises(CacheError, match="does not exist"):
        cache.publish(OTHER, tmp_path / "missing", {})


def test_bad_keys_are_refused(tmp_path):
    cache = EngineCache(tmp_path / "cache")
    for bad in ("", "../x", "A" * 64, "a" * 63):
        with pytest.raises(CacheError, match="not an engine cache key"):
            cache.lookup(bad)


def test_gc_keeps_the_most_recently_used(tmp_path):
    clock = FakeClock()
    cache = EngineCache(tmp_path / "cache", clock=clock)
    keys = [engine_key(EngineInputs(c * 64, {}, "90", "1", "1")) for c in "abcd"]
    for key in keys:
        cache.get_or_build(key, recording_build(tmp_path / "log"), {})
        clock.now += 100
    cache.lookup(keys[0])  # a hit makes it the most recent
    clock.now += 100
    assert sorted(cache.gc(keep_last=2)) == sorted(keys[1:3])
    assert {e.key for e in cache.entries()} == {keys[0], keys[3]}
    assert cache.gc(older_than_s=150) == [keys[3]]
    assert cache.gc(older_than_s=150) == []
    assert cache.gc(keep_last=0) == [keys[0]]


@pytest.mark.parametrize("kwargs", [{}, {"keep_last": -1}, {"older_than_s": -5}])
def test_gc_needs_a_valid_policy(tmp_path, kwargs):
    with pytest.raises(CacheError, match="gc") as e:
        EngineCache(tmp_path / "cache").gc(**kwargs)
    assert e.value.exit_code == 2


def test_gc_removes_staging_of_dead_processes_only(tmp_path):
    cache = EngineCache(tmp_path / "cache")
    mine = cache.local.staging_dir()
    dead = tmp_path / "cache" / "tmp" / "999999999-abc"
    dead.mkdir()
    cache.gc(keep_last=5)
    assert mine.exists() and not dead.exists()


def _build_in_process(cache_dir: str, log: str, results: str) -> None:
    path, outcome = EngineCache(Path(cache_dir)).get_or_build(KEY, recording_build(Path(log)), {})
    with open(results, "a") as handle:
        handle.write(f"{outcome} {path}\n")


def test_concurrent_processes_on_one_machine_build_once(tmp_path):
    log, results = tmp_path / "builds.log", tmp_path / "results"
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(
            target=_build_in_process, args=(str(tmp_path / "cache"), str(log), str(results))
        )
        for _ in range(8)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0] * 8
    outcomes = sorted(line.split()[0] for line in results.read_text().splitlines())
    assert builds(log) == 1
    assert outcomes == ["built"] + ["hit-local"] * 7


def test_verify_of_an_unknown_key_is_an_error(tmp_path):
    with pytest.raises(CacheError, match="no entry") as e:
        EngineCache(tmp_path / "cache").verify(KEY)
    assert e.value.exit_code == 2
