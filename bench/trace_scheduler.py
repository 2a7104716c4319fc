"""A per-step trace of vLLM's scheduler, for `bench.prefix_routing --trace` only.

The benchmark copies this file into each vLLM replica's model folder (beside model.py,
so the engine's process imports it by the name in `scheduler_cls`) with a
trace_scheduler.json naming the file to append to. vLLM's own scheduler does the
scheduling; this subclass only writes down, in wall-clock time (the client's clock):
- each request as the engine core receives it: its arrival at the engine's front end,
  its prompt's length, and the first and last tokens of the prompt, so the analysis can
  tell which conversation and turn it is (bench/engine_trace.py decodes them);
- each engine step: when it was scheduled and when its output came back, and per request
  in the batch the tokens scheduled and the tokens computed before the step (below the
  prompt's length, the step is part of that request's prefill).
Nothing of this is shipped: trident's vLLM model runs vLLM's default scheduler.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

HEAD_TOKENS, TAIL_TOKENS = 32, 160  # the phase's tag / the question's "Customer n, question t"


def _settings() -> dict:
    return json.loads((Path(__file__).with_name("trace_scheduler.json")).read_text())


class TracingScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = _settings()
        # Line-buffered appends: each record is whole on disk when the step ends.
        self._trace = open(settings["path"], "a", buffering=1)  # noqa: SIM115
        self._replica = settings["replica"]
        self._started: float | None = None

    def _write(self, record: dict) -> None:
        record["replica"] = self._replica
        self._trace.write(json.dumps(record, separators=(",", ":")) + "\n")

    def add_request(self, request: Any) -> None:
        added = time.time()
        super().add_request(request)
        prompt = list(request.prompt_token_ids or [])
        self._write(
            {
                "kind": "request",
                "id": request.request_id,
                "arrival": request.arrival_time,
                "added": added,
                "prompt_tokens": request.num_prompt_tokens,
                "head": prompt[:HEAD_TOKENS],
                "tail": prompt[-TAIL_TOKENS:],
            }
        )

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self._started = time.time()
        return super().schedule(*args, **kwargs)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        ended = time.time()
        batch = []
        for req_id, scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None:
                continue
            # schedule() has already advanced num_computed_tokens by this step's tokens.
            before = request.num_computed_tokens - scheduled
            batch.append([req_id, scheduled, before, request.num_prompt_tokens])
        if batch:
            self._write({"kind": "step", "start": self._started, "end": ended, "batch": batch})
        return super().update_from_output(scheduler_output, model_runner_output)
