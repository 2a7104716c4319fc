"""bench/aiperf_point.py's local hub cache: AIPerf 0.13 in offline mode finds a tokenizer
only through huggingface_hub's snapshot_download(local_files_only=True), which refuses a
folder's path; the cache the benchmark lays out must answer that call, offline."""

from __future__ import annotations

from huggingface_hub import snapshot_download

from bench.aiperf_point import local_hub_cache


def test_the_local_cache_answers_an_offline_snapshot_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tmp_path / "smollm2-135m-instruct"
    model.mkdir()
    (model / "tokenizer.json").write_text('{"version": "1.0"}')
    (model / "tokenizer_config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    cache = tmp_path / "hub"
    repo_id = local_hub_cache(model, cache)
    assert local_hub_cache(model, cache) == repo_id  # a second run reuses it
    found = snapshot_download(repo_id, local_files_only=True, cache_dir=cache)
    names = sorted(p.name for p in (tmp_path / found).iterdir())
    assert names == ["tokenizer.json", "tokenizer_config.json"]  # no weights: not needed
    assert (tmp_path / found / "tokenizer.json").read_text() == '{"version": "1.0"}'
