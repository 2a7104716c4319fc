"""Cache keys and manifests: pure logic, milliseconds."""

from __future__ import annotations

import json
import os

import pytest

from engine_cache import CacheError, EngineInputs, checkpoint_digest, engine_key
from engine_cache.key import CACHE_FORMAT_VERSION
from engine_cache.manifest import manifest_for_dir, parse_manifest, problems_in_dir

ARGS = {
    "max_batch_size": 8,
    "max_input_len": 1024,
    "gemm_plugin": "auto",
    "plugins": {"paged_kv_cache": True},
}


def inputs(**changes) -> EngineInputs:
    fields = dict(
        checkpoint_digest="a" * 64,
        build_args=ARGS,
        target_sm="90",
        trtllm_version="0.20.0",
        tensorrt_version="10.10.0",
    )
    fields.update(changes)
    return EngineInputs(**fields)


def make_checkpoint(path, files=None):
    files = files or {
        "config.json": b'{"architecture": "LlamaForCausalLM"}',
        "rank0.safetensors": b"\x00\x01weights",
    }
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def test_key_is_stable_and_independent_of_argument_order():
    reordered = dict(reversed(list(ARGS.items())))
    assert engine_key(inputs()) == engine_key(inputs(build_args=reordered))
    assert len(engine_key(inputs())) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"build_args": {**ARGS, "max_batch_size": 16}},
        {"build_args": {**ARGS, "plugins": {"paged_kv_cache": False}}},
        {"build_args": {**ARGS, "use_paged_context_fmha": True}},
        {"target_sm": "89"},
        {"trtllm_version": "0.21.0"},
        {"tensorrt_version": "10.11.0"},
        {"checkpoint_digest": "b" * 64},
    ],
)
def test_every_input_changes_the_key(change):
    assert engine_key(inputs(**change)) != engine_key(inputs())


def test_cache_format_version_is_part_of_the_key(monkeypatch):
    before = engine_key(inputs())
    monkeypatch.setattr("engine_cache.key.CACHE_FORMAT_VERSION", CACHE_FORMAT_VERSION + 1)
    assert engine_key(inputs()) != before


@pytest.mark.parametrize(
    "change, words",
    [
        ({"target_sm": ""}, "target_sm"),
        ({"target_sm": "hopper"}, "target_sm"),
        ({"trtllm_version": ""}, "trtllm_version"),
        ({"tensorrt_version": None}, "tensorrt_version"),
        ({"checkpoint_digest": "abc"}, "checkpoint_digest"),
        ({"build_args": {"x": object()}}, "build_args.x"),
        ({"build_args": {"x": [1, float("nan")]}}, "build_args.x[1]"),
        ({"build_args": {1: 2}}, "non-string key"),
        ({"build_args": ["max_batch_size"]}, "mapping"),
    ],
)
def test_bad_inputs_name_the_field(change, words):
    with pytest.raises(CacheError, match=words.replace("[", r"\[").replace("]", r"\]")) as e:
        inputs(**change)
    assert e.value.exit_code == 2


def test_checkpoint_digest_covers_content_names_and_files(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    original = checkpoint_digest(ckpt)
    assert checkpoint_digest(ckpt) == original

    moved = make_checkpoint(tmp_path / "elsewhere")
    assert checkpoint_digest(moved) == original, "location must not matter"

    (ckpt / "rank0.safetensors").write_bytes(b"\x00\x02weights")
    flipped = checkpoint_digest(ckpt)
    assert flipped != original

    (ckpt / "rank0.safetensors").rename(ckpt / "rank1.safetensors")
    assert checkpoint_digest(ckpt) not in (original, flipped)

    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "extra.bin").write_bytes(b"")
    assert checkpoint_digest(ckpt) not in (original, flipped)


def test_checkpoint_digest_of_missing_or_empty_path(tmp_path):
    with pytest.raises(CacheError, match="no such file"):
        checkpoint_digest(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CacheError, match="no files"):
        checkpoint_digest(tmp_path / "empty")


def test_checkpoint_digest_refuses_symlinks(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    (ckpt / "link.bin").symlink_to(ckpt / "config.json")
    with pytest.raises(CacheError, match="symbolic links"):
        checkpoint_digest(ckpt)


def test_manifest_round_trip_and_dir_problems(tmp_path):
    engine = make_checkpoint(
        tmp_path / "engine", {"rank0.engine": b"E" * 100, "config.json": b"{}"}
    )
    key = "c" * 64
    manifest = manifest_for_dir(key, engine, 123.0, {"profile": "short"})
    again = parse_manifest(manifest.to_json(), key, "test")
    assert again == manifest and again.size == 102
    assert problems_in_dir(manifest, engine) == []

    (engine / "rank0.engine").write_bytes(b"E" * 99 + b"F")
    assert problems_in_dir(manifest, engine, deep=False) == []
    assert problems_in_dir(manifest, engine) == ["rank0.engine: sha256 differs from the manifest"]
    (engine / "rank0.engine").write_bytes(b"E" * 50)
    assert "rank0.engine: size 50" in problems_in_dir(manifest, engine, deep=False)[0]
    (engine / "rank0.engine").unlink()
    (engine / "extra").write_bytes(b"")
    assert problems_in_dir(manifest, engine) == [
        "rank0.engine: missing",
        "extra: not in the manifest",
    ]


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda d: d.update(key="d" * 64), "does not match"),
        (lambda d: d.update(format=99), "format"),
        (lambda d: d["files"][0].update(path="../../etc/passwd"), "unsafe"),
        (lambda d: d["files"][0].update(path="/abs"), "unsafe"),
        (lambda d: d["files"][0].update(size=-1), "bad size"),
        (lambda d: d["files"][0].update(sha256="zz"), "bad sha256"),
        (lambda d: d.update(files=[]), "no files"),
        (lambda d: d.pop("files"), "files"),
    ],
)
def test_untrusted_manifest_is_rejected(tmp_path, mutate, words):
    engine = make_checkpoint(tmp_path / "engine", {"rank0.engine": b"E"})
    data = json.loads(manifest_for_dir("c" * 64, engine, 1.0, {}).to_json())
    mutate(data)
    with pytest.raises(CacheError, match=words):
        parse_manifest(json.dumps(data).encode(), "c" * 64, "s3://b/k/manifest.json")


def test_digest_memo_skips_rehashing_unchanged_files(tmp_path, monkeypatch):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    memo = tmp_path / "memo" / "digests.json"
    cold = checkpoint_digest(ckpt, memo_file=memo)
    assert cold == checkpoint_digest(ckpt)

    hashed = []
    real = __import__("engine_cache.key", fromlist=["file_sha256"]).file_sha256
    monkeypatch.setattr("engine_cache.key.file_sha256", lambda p: hashed.append(p) or real(p))
    assert checkpoint_digest(ckpt, memo_file=memo) == cold and hashed == []

    weights = ckpt / "rank0.safetensors"
    stat = weights.stat()
    weights.write_bytes(b"\x00\x02weights")  # same size
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the old mtime
    changed = checkpoint_digest(ckpt, memo_file=memo)
    assert changed != cold and hashed == [weights]  # ctime still gave it away


def test_damaged_memo_is_ignored(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt")
    memo = tmp_path / "digests.json"
    memo.write_text("{not json")
    assert checkpoint_digest(ckpt, memo_file=memo) == checkpoint_digest(ckpt)
    assert json.loads(memo.read_text())
