"""Where an engine that keeps its own Prometheus gauges in files writes them, for the
OpenAI frontend to read (builder/serve/openai/pod_metrics.py, the pod's load).

SGLang's scheduler runs in its own processes and, with `enable_metrics`, writes its
gauges (requests running and queued, KV token usage) through prometheus_client's
multiprocess mode: memory-mapped files in PROMETHEUS_MULTIPROC_DIR. `trident serve`
names a folder in tritonserver's environment (interface.ENGINE_GAUGES_DIR_ENV); each
SGLang model instance points SGLang at its own folder inside it, and the frontend reads
them when the pod's load is scraped. No stub code runs per update and nothing goes
through tritonserver: a custom-metric write is a round trip to tritonserver over shared
memory, and a stub killed in the middle of one can abort tritonserver (Triton 2.51's
lock_exception; docs/results/2026-12-05-stub-kills-six-runs.md).

No import from Triton or trident: the builder imports this module too, for the names.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from trident_common.interface import ENGINE_GAUGES_DIR_ENV

# The ServerArgs field that turns SGLang's metrics on (sglang 0.5.23); trident turns it
# on unless the spec's engine_args turn it off.
SGLANG_METRICS_ARG = "enable_metrics"
# The files prometheus_client writes for gauges in the "mostrecent" mode SGLang's
# scheduler gauges use (prometheus_client 0.2x: gauge_<mode>_<pid>.db).
GAUGE_FILES = "gauge_mostrecent_*.db"


def sglang_reports_load(engine_args: Mapping[str, object]) -> bool:
    """Whether an SGLang engine with these arguments keeps its load gauges."""
    return engine_args.get(SGLANG_METRICS_ARG, True) is not False


def instance_folder(root: str | Path, model: str, instance: str) -> Path:
    return Path(root) / model / instance


def model_files(root: str | Path, model: str) -> list[Path]:
    """The gauge files of every instance of `model`."""
    return sorted(Path(root).glob(f"{model}/*/{GAUGE_FILES}"))


def prepare(environ: Mapping[str, str], model: str, instance: str) -> Path | None:
    """This instance's folder, empty (the files of an engine killed with an earlier stub
    would read as its load), or None when the server named no folder."""
    root = environ.get(ENGINE_GAUGES_DIR_ENV)
    if not root:
        return None
    folder = instance_folder(root, model, instance)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700, parents=True)
    return folder
