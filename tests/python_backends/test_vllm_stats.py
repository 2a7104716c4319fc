"""python_backends/vllm/stats.py: vLLM's engine-step stats turned into vllm_backend's
vllm:* series (against the stub's pb_utils double, tests/fakes/fake_pb_utils.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.fakes import fake_pb_utils as pb

LABELS = {"model": "chat", "version": "1"}


@pytest.fixture
def stats_module():
    """python_backends.vllm.stats, under the pb_utils double (tests/conftest.py)."""
    from python_backends.vllm import stats

    return stats


def step(prompt=0, generated=0, ttfts=(), itls=(), finished=(), running=1, waiting=0, kv=0.0):
    scheduler = SimpleNamespace(
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_skipped_waiting_reqs=0,
        kv_cache_usage=kv,
    )
    iteration = SimpleNamespace(
        num_prompt_tokens=prompt,
        num_generation_tokens=generated,
        time_to_first_tokens_iter=list(ttfts),
        inter_token_latencies_iter=list(itls),
        n_params_iter=[1] * len(ttfts),
        finished_requests=list(finished),
    )
    return scheduler, iteration


def done(reason="length", prompt=5, generated=3, latency=0.5):
    return SimpleNamespace(
        finish_reason=reason,
        e2e_latency=latency,
        num_prompt_tokens=prompt,
        num_generation_tokens=generated,
    )


def series(name, **extra):
    found = pb.metric(name, **LABELS, **extra)
    assert found is not None, f"no series {name} {extra}"
    return found


def test_token_buckets_are_1_2_5_up_to_the_limit(stats_module):
    assert stats_module.token_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert stats_module.token_buckets(1024)[-1] == 1000


def test_one_step_becomes_counter_gauge_and_histogram_updates(stats_module):
    updates = stats_module.updates(
        *step(
            prompt=7,
            generated=1,
            ttfts=[0.2],
            finished=[done("stop")],
            running=2,
            waiting=3,
            kv=0.25,
        )
    )
    by_key = {}
    for u in updates:
        by_key.setdefault(u.key, []).append((u.op, u.value))
    assert by_key["prompt_tokens"] == [("increment", 7)]
    assert by_key["running"] == [("set", 2)] and by_key["waiting"] == [("set", 3)]
    assert by_key["kv_cache_usage"] == [("set", 0.25)]
    assert by_key["ttft"] == [("observe", 0.2)]
    assert by_key["success:stop"] == [("increment", 1)]
    assert by_key["request_generation_tokens"] == [("observe", 3)]
    assert "tpot" not in by_key  # no inter-token latency in this step
    assert stats_module.updates(None, None) == []


def test_coalesce_sums_increments_keeps_last_gauge_and_every_sample(stats_module):
    U = stats_module.Update
    merged = stats_module.coalesce(
        [
            U("a", "increment", 2),
            U("g", "set", 1),
            U("h", "observe", 0.1),
            U("a", "increment", 3),
            U("g", "set", 4),
            U("h", "observe", 0.2),
        ]
    )
    assert sorted(merged) == sorted(
        [U("a", "increment", 5), U("g", "set", 4), U("h", "observe", 0.1), U("h", "observe", 0.2)]
    )


def test_recorded_steps_reach_the_vllm_series_with_model_and_version(stats_module):
    stats = stats_module.VllmStats(LABELS, max_model_len=1024)
    logger = stats.logger_factory(vllm_config=None, engine_index=0)
    logger.record(*step(prompt=12, generated=1, ttfts=[0.05]))
    logger.record(*step(generated=1, itls=[0.01]))
    logger.record(*step(generated=1, itls=[0.02], finished=[done("length", 12, 3, 0.4)], running=0))
    stats.close()  # writes what is queued, then stops
    assert series("vllm:prompt_tokens_total").value() == 12
    assert series("vllm:generation_tokens_total").value() == 3
    assert series("vllm:num_requests_running").value() == 0
    assert series("vllm:time_to_first_token_seconds").observations == [0.05]
    assert series("vllm:time_per_output_token_seconds").observations == [0.01, 0.02]
    assert series("vllm:e2e_request_latency_seconds").observations == [0.4]
    assert series("vllm:request_prompt_tokens").observations == [12]
    assert series("vllm:request_prompt_tokens").buckets[-1] == 1000
    assert series("vllm:request_success_total", finished_reason="length").value() == 1


def test_nothing_is_written_after_close(stats_module):
    stats = stats_module.VllmStats(LABELS, max_model_len=64)
    stats.close()
    stats.record(*step(prompt=9))
    assert series("vllm:prompt_tokens_total").value() == 0


@pytest.mark.vllm
def test_updates_read_the_installed_vllms_stats_classes(stats_module):
    """The field names stats.py reads exist in the vLLM this project installs."""
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

    iteration = IterationStats()
    iteration.num_generation_tokens = 4
    iteration.time_to_first_tokens_iter.append(0.1)
    iteration.finished_requests.append(
        FinishedRequestStats(
            finish_reason=FinishReason.STOP,
            e2e_latency=0.3,
            num_prompt_tokens=6,
            num_generation_tokens=4,
        )
    )
    scheduler = SchedulerStats(num_running_reqs=1)
    scheduler.running_lora_adapters["paris"] = 1
    updates = stats_module.updates(scheduler, iteration, ("paris",))
    keys = {u.key for u in updates}
    assert {"running", "waiting", "generation_tokens", "ttft", "e2e", "success:stop"} <= keys
    assert {u.key: u.value for u in updates if u.key.startswith("lora_")} == {
        "lora_running:paris": 1,
        "lora_waiting:paris": 0,
    }


def test_each_adapter_reads_its_running_and_waiting_requests_every_step(stats_module):
    """Per adapter of the model, vLLM's own counts (SchedulerStats.*_lora_adapters); an
    adapter vLLM no longer lists (its last request ended) reads 0, not its last count."""
    stats = stats_module.VllmStats(
        LABELS, max_model_len=64, adapters=("paris", "france"), max_loras=2
    )
    logger = stats.logger_factory(vllm_config=None)
    scheduler, iteration = step()
    scheduler.running_lora_adapters = {"paris": 2, "france": 0}
    scheduler.waiting_lora_adapters = {"paris": 0, "france": 3}
    logger.record(scheduler, iteration)
    stats.close()
    assert series("trident_lora_requests_running", adapter="paris").value() == 2
    assert series("trident_lora_requests_waiting", adapter="france").value() == 3
    assert series("trident_lora_max").value() == 2

    later, _ = step()
    later.running_lora_adapters, later.waiting_lora_adapters = {}, {"paris": 1}
    keyed = {u.key: u.value for u in stats_module.updates(later, None, ("paris", "france"))}
    assert keyed == {
        "lora_running:paris": 0,
        "lora_waiting:paris": 1,
        "lora_running:france": 0,
        "lora_waiting:france": 0,
        "running": 1,
        "waiting": 0,
        "kv_cache_usage": 0.0,
    }


def test_a_model_without_adapters_has_no_adapter_series(stats_module):
    plain = {"model": "no_adapters", "version": "1"}  # series outlive a test: its own
    stats = stats_module.VllmStats(plain, max_model_len=64)
    stats.close()
    assert pb.metric("vllm:num_requests_running", **plain) is not None
    assert pb.metric("trident_lora_max", **plain) is None
