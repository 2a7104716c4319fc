"""Engine cache restore throughput vs a plain boto3 download of the same bytes.

Against a real SeaweedFS on loopback: publish a fake TP=2 engine (two rank files of random
bytes + config.json), then alternate, several times, (a) EngineCache.lookup on an empty local
cache (download + sha256 of every byte + atomic rename into the local tier) and (b) a plain
loop of boto3 `download_file` over the same objects with boto3's default transfer settings.
Both sides get a fresh client each time (created before the clock starts). Medians are
compared; target: ours >= 0.9x direct.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from engine_cache import EngineCache, EngineInputs, engine_key, parse_s3_uri
from support.s3_server import SeaweedS3

MiB = 1 << 20
RANK_FILE_MIB = int(os.environ.get("TRIDENT_BENCH_CACHE_RANK_MIB", "160"))
REPEATS = int(os.environ.get("TRIDENT_BENCH_CACHE_REPEATS", "9"))
TARGET_RATIO = 0.9


def write_fake_engine(directory: Path, rank_mib: int) -> int:
    """rank0.engine and rank1.engine of random bytes plus a config.json; returns bytes."""
    directory.mkdir(parents=True)
    for rank in (0, 1):
        with open(directory / f"rank{rank}.engine", "wb") as handle:
            for _ in range(rank_mib // 16):
                handle.write(os.urandom(16 * MiB))
    (directory / "config.json").write_text('{"pretrained_config": {"mapping": {"tp_size": 2}}}')
    return sum(p.stat().st_size for p in directory.iterdir())


class Timing(NamedTuple):
    wall_s: float
    cpu_s: float  # this process, all threads (the server's CPU is not included)


def restore_with_cache(uri: str, key: str, scratch: Path) -> Timing:
    local = scratch / "cache"
    cache = EngineCache(local, uri)  # client set-up is not timed on either side
    started, cpu = time.perf_counter(), time.process_time()
    path = cache.lookup(key)
    elapsed = Timing(time.perf_counter() - started, time.process_time() - cpu)
    if path is None:
        raise RuntimeError("the benchmark entry was not restored")
    shutil.rmtree(local)
    return elapsed


def download_plainly(
    server: SeaweedS3, bucket: str, object_keys: list[str], scratch: Path
) -> Timing:
    target = scratch / "plain"
    target.mkdir()
    client = server.client()  # a new client each time, as the cache gets
    started, cpu = time.perf_counter(), time.process_time()
    for object_key in object_keys:
        client.download_file(bucket, object_key, str(target / object_key.rsplit("/", 1)[1]))
    elapsed = Timing(time.perf_counter() - started, time.process_time() - cpu)
    shutil.rmtree(target)
    return elapsed


@contextmanager
def _aws_environment(values: dict[str, str]) -> Iterator[None]:
    """The server's endpoint and credentials, as the standard AWS variables, for a while."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _alternating_runs(
    server: SeaweedS3, uri: str, key: str, work: Path
) -> tuple[list[Timing], list[Timing]]:
    client = server.client()
    location = parse_s3_uri(uri)
    object_keys = [
        item["Key"]
        for item in client.list_objects_v2(
            Bucket=location.bucket, Prefix=location.object_key(key, "files") + "/"
        )["Contents"]
    ]
    ours, direct = [], []
    for repeat in range(REPEATS):
        # Alternate which goes first so neither always gets the warmer server.
        if repeat % 2:
            direct.append(download_plainly(server, location.bucket, object_keys, work))
            ours.append(restore_with_cache(uri, key, work))
        else:
            ours.append(restore_with_cache(uri, key, work))
            direct.append(download_plainly(server, location.bucket, object_keys, work))
    return ours, direct


def run(out_dir: Path) -> dict:
    uri = "s3://bench/engines"
    key = engine_key(EngineInputs("0" * 64, {"bench": True}, "90", "bench", "bench"))
    with tempfile.TemporaryDirectory(prefix="trident-bench-cache-") as tmp:
        work = Path(tmp)
        total = write_fake_engine(work / "engine", RANK_FILE_MIB)
        with SeaweedS3(work / "s3") as server, _aws_environment(server.env):
            server.client().create_bucket(Bucket=parse_s3_uri(uri).bucket)
            started = time.perf_counter()
            EngineCache(work / "publisher", uri).publish(key, work / "engine", {"bench": 1})
            publish_s = time.perf_counter() - started
            ours, direct = _alternating_runs(server, uri, key, work)
            hit_s = _warm_hit_seconds(uri, key, work)
    ours_mbs = total / MiB / statistics.median(t.wall_s for t in ours)
    direct_mbs = total / MiB / statistics.median(t.wall_s for t in direct)
    ratio = ours_mbs / direct_mbs
    ours_cpu = statistics.median(t.cpu_s for t in ours)
    direct_cpu = statistics.median(t.cpu_s for t in direct)
    return {
        "name": "cache_restore",
        "bytes": total,
        "repeats": REPEATS,
        "ours_s": [round(t.wall_s, 3) for t in ours],
        "direct_s": [round(t.wall_s, 3) for t in direct],
        "publish_s": round(publish_s, 3),
        # Client, server and sha256 share this machine's cores: a busy machine lowers the
        # ratio (verification is extra CPU), so the load is recorded with the result.
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "rows": [
            {
                "metric": f"restore MB/s ({total // MiB} MiB, verified)",
                "ours": ours_mbs,
                "direct": direct_mbs,
                "ratio": ratio,
                "target": f">= {TARGET_RATIO}x",
                "met": ratio >= TARGET_RATIO,
            },
            {
                "metric": "client CPU s per restore (incl. sha256)",
                "ours": ours_cpu,
                "direct": direct_cpu,
                "ratio": ours_cpu / direct_cpu,
                "target": "",
                "met": None,
            },
            {
                "metric": "warm local hit (ms)",
                "ours": hit_s * 1000,
                "direct": None,
                "ratio": None,
                "target": "",
                "met": None,
            },
        ],
    }


def _warm_hit_seconds(uri: str, key: str, work: Path) -> float:
    cache = EngineCache(work / "warm", uri)
    cache.lookup(key)  # fetch once; the timed lookup is a local hit
    started = time.perf_counter()
    if cache.lookup(key) is None:
        raise RuntimeError("warm lookup missed")
    return time.perf_counter() - started
