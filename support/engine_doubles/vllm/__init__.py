"""A double of the vLLM 0.32 surface that trident's vLLM model (python_backends/vllm/model.py)
uses, answering at a configured pace (support/pacing.py) instead of running a model:
AsyncLLM (generate yielding RequestOutputs, DELTA or CUMULATIVE, abort, shutdown, stat
loggers fed once per step, get_tokenizer), AsyncEngineArgs, SamplingParams, LoRARequest and
the exceptions the model catches. For benchmarks of the serving path at GPU token rates."""

from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: F401
from vllm.sampling_params import SamplingParams  # noqa: F401

__version__ = "0.32.0+rate-double"
