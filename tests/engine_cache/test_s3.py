"""EngineCache against a real SeaweedFS S3 server: publish, fetch, damage, leases, errors."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import botocore.exceptions
import pytest

from builder.serve.server import free_port
from engine_cache import CacheError, EngineCache, EngineInputs, checkpoint_digest, engine_key
from engine_cache.lease import LeaseRecord
from engine_cache.s3 import MiB, TransferConfig
from tests.helpers.engine_cache import FakeClock, builds, recording_build

pytestmark = pytest.mark.s3

KEY = engine_key(EngineInputs("a" * 64, {"max_batch_size": 8}, "90", "0.20.0", "10.10.0"))
OTHER = engine_key(EngineInputs("b" * 64, {"max_batch_size": 8}, "90", "0.20.0", "10.10.0"))
# Small parts so a test file of a few MiB really goes through multipart transfers.
SMALL_PARTS = TransferConfig(
    multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=4
)


def machine(bucket, root: Path, name: str, **kwargs) -> EngineCache:
    """A cache as one machine sees it: its own local dir, the shared bucket."""
    kwargs.setdefault("poll_s", 0.05)
    return EngineCache(root / name, bucket.uri, **kwargs)


def entry_objects(bucket, key=KEY) -> list[str]:
    return [k for k in bucket.keys() if k.startswith(f"engines/{key}/")]


def s3_file(bucket, name: str, key=KEY) -> str:
    [object_key] = [k for k in entry_objects(bucket, key) if k.endswith("/" + name)]
    return object_key


def test_miss_build_publish_then_fetch_on_a_new_machine(s3_bucket, tmp_path):
    log = tmp_path / "builds.log"
    first = machine(s3_bucket, tmp_path, "ci-1")
    path, outcome = first.get_or_build(KEY, recording_build(log), {"profile": "short"})
    assert outcome == "built" and builds(log) == 1

    objects = entry_objects(s3_bucket)
    assert f"engines/{KEY}/manifest.json" in objects
    assert not any(k.endswith("lease.json") for k in objects), "the lease is released"
    manifest = json.loads(
        s3_bucket.client()
        .get_object(Bucket=s3_bucket.name, Key=f"engines/{KEY}/manifest.json")["Body"]
        .read()
    )
    assert {f["path"] for f in manifest["files"]} == {"rank0.engine", "config.json"}
    assert manifest["metadata"] == {"profile": "short"}

    assert first.get_or_build(KEY, recording_build(log), {}) == (path, "hit-local")
    fresh = machine(s3_bucket, tmp_path, "laptop")
    fetched, outcome = fresh.get_or_build(KEY, recording_build(log), {})
    assert outcome == "hit-s3" and builds(log) == 1
    assert (fetched / "rank0.engine").read_bytes() == (path / "rank0.engine").read_bytes()
    assert fresh.stats()["fetch_bytes"] == sum(f["size"] for f in manifest["files"])
    assert fresh.stats()["hits_s3"] == 1
    assert [(e.key, e.tier) for e in fresh.entries()] == [(KEY, "local+s3")]
    assert [(e.key, e.tier) for e in machine(s3_bucket, tmp_path, "x").entries()] == [(KEY, "s3")]


def test_changed_checkpoint_or_build_arg_builds_a_new_entry(s3_bucket, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "rank0.safetensors").write_bytes(b"weights-v1")
    log = tmp_path / "builds.log"

    def key_for(**args):
        return engine_key(
            EngineInputs(
                checkpoint_digest(ckpt), {"max_batch_size": 8, **args}, "90", "0.20.0", "10.10.0"
            )
        )

    cache = machine(s3_bucket, tmp_path, "ci")
    original = key_for()
    cache.get_or_build(original, recording_build(log), {})
    assert cache.get_or_build(key_for(), recording_build(log), {})[1] == "hit-local"
    bigger_batch = key_for(max_batch_size=16)
    assert cache.get_or_build(bigger_batch, recording_build(log), {})[1] == "built"
    (ckpt / "rank0.safetensors").write_bytes(b"weights-v2")
    new_weights = key_for()
    assert new_weights != original
    assert cache.get_or_build(new_weights, recording_build(log), {})[1] == "built"
    assert builds(log) == 3
    assert {e.key for e in cache.entries()} == {original, bigger_batch, new_weights}


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_s3_entry_is_never_used(s3_bucket, tmp_path, damage):
    log = tmp_path / "builds.log"
    good, _ = machine(s3_bucket, tmp_path, "ci").get_or_build(KEY, recording_build(log), {})
    client, engine_object = s3_bucket.client(), s3_file(s3_bucket, "rank0.engine")
    data = bytearray(client.get_object(Bucket=s3_bucket.name, Key=engine_object)["Body"].read())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        client.put_object(Bucket=s3_bucket.name, Key=engine_object, Body=bytes(data))
    elif damage == "truncate":
        client.put_object(Bucket=s3_bucket.name, Key=engine_object, Body=bytes(data[:-1]))
    else:
        client.delete_object(Bucket=s3_bucket.name, Key=engine_object)

    victim = machine(s3_bucket, tmp_path, "new-box")
    assert victim.lookup(KEY) is None, "a damaged entry must not be served"
    assert not (tmp_path / "new-box" / "entries" / KEY).exists()
    assert victim.stats()["corrupt_entries"] == 1
    quarantined = [k for k in s3_bucket.keys() if k.startswith(f"engines/quarantine/{KEY}/")]
    assert any(k.endswith("/reason.txt") for k in quarantined)
    assert f"engines/{KEY}/manifest.json" not in s3_bucket.keys()

    path, outcome = victim.get_or_build(KEY, recording_build(log), {})
    assert outcome == "built" and builds(log) == 2
    third, outcome = machine(s3_bucket, tmp_path, "third").get_or_build(
        KEY, recording_build(log), {}
    )
    assert outcome == "hit-s3"
    assert (third / "rank0.engine").read_bytes() == (good / "rank0.engine").read_bytes()


def test_verify_finds_and_quarantines_a_truncated_s3_object(s3_bucket, tmp_path):
    cache = machine(s3_bucket, tmp_path, "ci")
    cache.get_or_build(KEY, recording_build(tmp_path / "log"), {})
    assert cache.verify() == []
    assert machine(s3_bucket, tmp_path, "s3-only").verify(KEY) == []
    client, engine_object = s3_bucket.client(), s3_file(s3_bucket, "rank0.engine")
    client.put_object(Bucket=s3_bucket.name, Key=engine_object, Body=b"short")
    problems = cache.verify()
    assert len(problems) == 1 and problems[0].startswith(f"s3 {KEY}: rank0.engine: 5 bytes")
    assert [e.tier for e in cache.entries()] == ["local"]


def test_corrupt_manifest_is_quarantined(s3_bucket, tmp_path):
    machine(s3_bucket, tmp_path, "ci").get_or_build(KEY, recording_build(tmp_path / "l"), {})
    s3_bucket.client().put_object(
        Bucket=s3_bucket.name,
        Key=f"engines/{KEY}/manifest.json",
        Body=b'{"format": 1, "files": "nope"',
    )
    assert machine(s3_bucket, tmp_path, "other").lookup(KEY) is None
    assert f"engines/{KEY}/manifest.json" not in s3_bucket.keys()


def _upload_then_die(uri: str, cache_dir: str, log: str) -> None:
    """In a child process: build, and SIGKILL ourselves while the second part is sent,
    once the small file (uploaded alongside, on another thread) is stored and listed:
    without that wait the kill could land before any byte reached S3, and the test would
    be a race. (A CI check met it: the PutObject's after-call, which fires for a failed
    attempt too, was all it waited for, and the bucket then held no file.)"""
    cache = EngineCache(Path(cache_dir), uri, transfer_config=SMALL_PARTS)
    client, bucket = cache.s3.client, cache.s3.location.bucket
    parts_sent = []
    small_file_stored = threading.Event()

    def stored(http_response, **_):
        if http_response.status_code == 200:
            small_file_stored.set()

    def listed() -> bool:
        found = client.list_objects_v2(Bucket=bucket).get("Contents", [])
        return any("/files/" in item["Key"] for item in found)

    def die_on_second_part(**_):
        parts_sent.append(1)
        if len(parts_sent) == 2:
            small_file_stored.wait(30)
            deadline = time.monotonic() + 30
            while not listed() and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)

    events = client.meta.events
    events.register("after-call.s3.PutObject", stored)
    events.register("before-send.s3.UploadPart", die_on_second_part)
    cache.get_or_build(KEY, recording_build(Path(log), payload=b"\x01" * (12 * MiB)), {})


def _interrupt_with_network_error(cache: EngineCache, log: Path) -> None:
    parts_sent = []

    def fail_after_first_part(request, **_):
        parts_sent.append(request.url)
        if len(parts_sent) >= 2:
            raise botocore.exceptions.ConnectionClosedError(endpoint_url=request.url)

    events = cache.s3.client.meta.events
    events.register("before-send.s3.UploadPart", fail_after_first_part)
    try:
        with pytest.raises(CacheError, match="publishing it failed"):
            cache.get_or_build(KEY, recording_build(log, payload=b"\x01" * (12 * MiB)), {})
    finally:
        events.unregister("before-send.s3.UploadPart", fail_after_first_part)
    assert len(parts_sent) >= 2


@pytest.mark.parametrize("failure", ["process-killed", "network-error"])
def test_upload_interrupted_half_way_leaves_no_entry(s3_bucket, tmp_path, failure):
    """A real multipart upload that dies after its first part: no manifest, nothing served;
    the next run on the same machine finishes the publication without rebuilding."""
    log = tmp_path / "builds.log"
    if failure == "process-killed":
        child = multiprocessing.get_context("spawn").Process(
            target=_upload_then_die, args=(s3_bucket.uri, str(tmp_path / "ci"), str(log))
        )
        child.start()
        child.join(60)
        assert child.exitcode == -signal.SIGKILL
        assert any("/files/" in k for k in s3_bucket.keys()), "bytes were uploaded..."
    else:
        _interrupt_with_network_error(
            machine(s3_bucket, tmp_path, "ci", transfer_config=SMALL_PARTS), log
        )
    assert f"engines/{KEY}/manifest.json" not in s3_bucket.keys(), "...but no entry exists"
    assert machine(s3_bucket, tmp_path, "other").lookup(KEY) is None
    assert machine(s3_bucket, tmp_path, "other").entries() == []

    path, outcome = machine(s3_bucket, tmp_path, "ci").get_or_build(KEY, recording_build(log), {})
    assert outcome == "hit-local" and builds(log) == 1
    fetched = machine(s3_bucket, tmp_path, "third").lookup(KEY)
    assert (fetched / "rank0.engine").read_bytes() == (path / "rank0.engine").read_bytes()


def test_second_publisher_does_not_overwrite_the_first(s3_bucket, tmp_path):
    one = machine(s3_bucket, tmp_path, "one")
    one.get_or_build(KEY, recording_build(tmp_path / "log", payload=b"first build"), {})
    other = tmp_path / "other-build"
    other.mkdir()
    (other / "rank0.engine").write_bytes(b"second, different build")
    two = machine(s3_bucket, tmp_path, "two")
    two.publish(KEY, other, {})
    assert two.stats()["publish_conflicts"] == 1
    fetched = machine(s3_bucket, tmp_path, "three").lookup(KEY)
    assert (fetched / "rank0.engine").read_bytes() == b"first build"
    assert len({k.split("/")[3] for k in entry_objects(s3_bucket) if "/files/" in k}) == 1


def _machine_process(uri: str, root: str, name: str, log: str, results: str) -> None:
    cache = EngineCache(Path(root) / name, uri, poll_s=0.05)
    build = recording_build(Path(log), payload=b"E" * 4096)

    def slow_build(out: Path) -> None:
        build(out)
        import time

        time.sleep(1.0)  # a compile long enough for every process to contend

    path, outcome = cache.get_or_build(KEY, slow_build, {})
    with open(results, "a") as handle:
        handle.write(f"{outcome} {(path / 'rank0.engine').stat().st_size}\n")


@pytest.mark.parametrize("shared_local_dir", [False, True], ids=["8-machines", "1-machine"])
def test_eight_concurrent_builders_compile_once(s3_bucket, tmp_path, shared_local_dir):
    log, results = tmp_path / "builds.log", tmp_path / "results"
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(
            target=_machine_process,
            args=(
                s3_bucket.uri,
                str(tmp_path),
                "shared" if shared_local_dir else f"m{i}",
                str(log),
                str(results),
            ),
        )
        for i in range(8)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0] * 8
    assert builds(log) == 1
    outcomes = sorted(line.split()[0] for line in results.read_text().splitlines())
    reused = "hit-local" if shared_local_dir else "hit-s3"
    assert outcomes == ["built"] + [reused] * 7
    assert {line.split()[1] for line in results.read_text().splitlines()} == {"4096"}


def _plant_lease(bucket, owner: str, expires_at: float) -> None:
    bucket.client().put_object(
        Bucket=bucket.name,
        Key=f"engines/{KEY}/lease.json",
        Body=LeaseRecord(owner, expires_at).to_json(),
    )


def test_expired_lease_of_a_dead_builder_is_taken_over(s3_bucket, tmp_path):
    clock = FakeClock()
    _plant_lease(s3_bucket, "dead-host:123:abc", clock.now - 1)
    path, outcome = machine(s3_bucket, tmp_path, "ci", clock=clock).get_or_build(
        KEY, recording_build(tmp_path / "log"), {}
    )
    assert outcome == "built"
    assert f"engines/{KEY}/lease.json" not in s3_bucket.keys()


def test_waiter_gives_up_on_a_live_lease_after_its_timeout(s3_bucket, tmp_path):
    clock = FakeClock()
    _plant_lease(s3_bucket, "busy-host:9:xyz", clock.now + 3600)

    def sleep(seconds):
        clock.now += seconds

    cache = machine(
        s3_bucket, tmp_path, "ci", clock=clock, sleep=sleep, poll_s=30, wait_timeout_s=120
    )
    with pytest.raises(CacheError, match="busy-host:9:xyz"):
        cache.get_or_build(KEY, recording_build(tmp_path / "log"), {})
    assert builds(tmp_path / "log") == 0 and cache.stats()["lease_waits"] == 1


def test_waiter_reuses_what_the_lease_holder_publishes(s3_bucket, tmp_path):
    clock = FakeClock()
    _plant_lease(s3_bucket, "builder:1:a", clock.now + 3600)
    holder = machine(s3_bucket, tmp_path, "holder")
    holder.local.publish_copy(KEY, _engine_dir(tmp_path), {})
    polls = []

    def sleep(seconds):  # the holder finishes while the waiter sleeps
        polls.append(seconds)
        holder._publish_pending(KEY)

    waiter = machine(s3_bucket, tmp_path, "waiter", clock=clock, sleep=sleep)
    path, outcome = waiter.get_or_build(KEY, recording_build(tmp_path / "log"), {})
    assert outcome == "hit-s3" and polls and builds(tmp_path / "log") == 0


def _engine_dir(tmp_path: Path) -> Path:
    engine = tmp_path / "prebuilt"
    engine.mkdir()
    (engine / "rank0.engine").write_bytes(b"prebuilt")
    return engine


def test_unreachable_s3_is_a_clear_error_or_local_only(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    dead = f"http://127.0.0.1:{free_port()}"
    cache = EngineCache(tmp_path / "c", "s3://bucket/engines", endpoint_url=dead)
    with pytest.raises(CacheError, match=f"S3 endpoint {dead} is unreachable"):
        cache.get_or_build(KEY, recording_build(tmp_path / "log"), {})
    assert builds(tmp_path / "log") == 0

    offline = EngineCache(tmp_path / "c", "s3://bucket/engines", endpoint_url=dead, local_only=True)
    assert offline.get_or_build(KEY, recording_build(tmp_path / "log"), {})[1] == "built"
    assert offline.get_or_build(KEY, recording_build(tmp_path / "log"), {})[1] == "hit-local"
    assert [e.tier for e in offline.entries()] == ["local"]
    assert offline.lookup(OTHER) is None and offline.verify() == []


def test_local_only_still_uses_a_reachable_s3(s3_bucket, tmp_path):
    cache = machine(s3_bucket, tmp_path, "ci", local_only=True)
    assert cache.get_or_build(KEY, recording_build(tmp_path / "log"), {})[1] == "built"
    assert machine(s3_bucket, tmp_path, "other").lookup(KEY) is not None


def test_s3_going_away_after_the_build_keeps_the_engine(s3_bucket, tmp_path):
    """local_only: an endpoint lost between build and upload costs the upload, not the
    build; without local_only it is an error, and the next run publishes."""

    def build_then_lose_s3(cache):
        def build(out: Path):
            recording_build(tmp_path / "log")(out)
            cache.s3.client.meta.events.register("before-send.s3", _refuse_connection)

        return build

    tolerant = machine(s3_bucket, tmp_path, "tolerant", local_only=True)
    assert tolerant.get_or_build(KEY, build_then_lose_s3(tolerant), {})[1] == "built"
    assert tolerant.s3 is None
    strict = machine(s3_bucket, tmp_path, "strict")
    with pytest.raises(CacheError, match="publishing it failed.*unreachable"):
        strict.get_or_build(OTHER, build_then_lose_s3(strict), {})
    assert (
        machine(s3_bucket, tmp_path, "strict").get_or_build(
            OTHER, recording_build(tmp_path / "log"), {}
        )[1]
        == "hit-local"
    )
    assert machine(s3_bucket, tmp_path, "third").lookup(OTHER) is not None
    assert builds(tmp_path / "log") == 2


def _refuse_connection(request, **_):
    raise botocore.exceptions.EndpointConnectionError(endpoint_url=request.url)


def test_endpoint_from_argument_and_wrong_credentials(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    explicit = EngineCache(tmp_path / "a", s3_bucket.uri, endpoint_url=s3_bucket.endpoint)
    assert explicit.get_or_build(KEY, recording_build(tmp_path / "log"), {})[1] == "built"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-value")
    wrong = EngineCache(tmp_path / "b", s3_bucket.uri, endpoint_url=s3_bucket.endpoint)
    with pytest.raises(CacheError, match="refused .*SignatureDoesNotMatch|refused .*Access") as e:
        wrong.lookup(KEY)
    assert "wrong-secret-value" not in str(e.value)


def test_missing_bucket_names_the_bucket(s3_bucket, tmp_path):
    cache = EngineCache(tmp_path / "a", "s3://no-such-bucket-here/engines")
    with pytest.raises(CacheError, match="no-such-bucket-here"):
        cache.lookup(KEY)


def test_missing_credentials_say_how_to_provide_them(s3_bucket, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(CacheError, match="no S3 credentials .*AWS_ACCESS_KEY_ID"):
        machine(s3_bucket, tmp_path, "anonymous").lookup(KEY)


def test_empty_files_and_subfolders_round_trip(s3_bucket, tmp_path):
    engine = tmp_path / "engine"
    (engine / "tokenizer").mkdir(parents=True)
    (engine / "rank0.engine").write_bytes(b"\x07" * 1000)
    (engine / "empty.bin").write_bytes(b"")
    (engine / "tokenizer" / "vocab.json").write_text('{"a": 1}')
    machine(s3_bucket, tmp_path, "ci").publish(KEY, engine, {"note": "hand-built"})
    fetched = machine(s3_bucket, tmp_path, "new").lookup(KEY)
    assert sorted(p.relative_to(fetched).as_posix() for p in fetched.rglob("*") if p.is_file()) == [
        "empty.bin",
        "rank0.engine",
        "tokenizer/vocab.json",
    ]
    assert (fetched / "empty.bin").read_bytes() == b""
    assert (fetched / "tokenizer" / "vocab.json").read_text() == '{"a": 1}'


def test_full_local_disk_is_an_error_not_a_corrupt_entry(s3_bucket, tmp_path, monkeypatch):
    machine(s3_bucket, tmp_path, "ci").get_or_build(KEY, recording_build(tmp_path / "l"), {})

    def disk_full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("engine_cache.verified_file.os.pwrite", disk_full)
    victim = machine(s3_bucket, tmp_path, "small-disk")
    with pytest.raises(CacheError, match="No space left on device"):
        victim.lookup(KEY)
    assert f"engines/{KEY}/manifest.json" in s3_bucket.keys(), "the S3 entry is fine"
    assert list((tmp_path / "small-disk" / "tmp").iterdir()) == []


def test_gc_of_the_bucket_removes_old_entries_and_abandoned_uploads(s3_bucket, tmp_path):
    clock = FakeClock()
    cache = machine(s3_bucket, tmp_path, "ci", clock=clock)
    cache.get_or_build(OTHER, recording_build(tmp_path / "log"), {})
    clock.now += 3 * 86400
    cache.get_or_build(KEY, recording_build(tmp_path / "log"), {})
    client = s3_bucket.client()
    for age_days, upload_id in ((2, "abandoned"), (0, "in-progress")):
        started = int(clock.now - age_days * 86400)
        client.put_object(
            Bucket=s3_bucket.name,
            Body=b"half",
            Key=f"engines/{KEY}/files/{started}-{upload_id}/rank0.engine",
        )

    assert cache.gc(older_than_s=10 * 86400, include_s3=True) == []
    uploads = {k.split("/")[3].split("-", 1)[1] for k in entry_objects(s3_bucket) if "/files/" in k}
    assert "abandoned" not in uploads and "in-progress" in uploads
    assert len(uploads) == 2  # the live one and the one in progress

    assert cache.gc(older_than_s=86400) == [OTHER]
    assert [e.tier for e in cache.entries() if e.key == OTHER] == ["s3"], "local only"
    assert cache.gc(older_than_s=86400, include_s3=True) == [OTHER]
    assert entry_objects(s3_bucket, OTHER) == []
    assert machine(s3_bucket, tmp_path, "new").lookup(KEY) is not None
