"""AsyncEngineArgs: the engine arguments (model.json) as attributes. Two are the double's
own: `rate` (support.pacing.Rate's fields) and `rate_control` (a JSON file of them that the
benchmark rewrites between load points)."""
from typing import Optional


class AsyncEngineArgs:
    def __init__(self, rate: Optional[dict] = None, rate_control: Optional[str] = None,
                 max_model_len: Optional[int] = None, disable_log_stats: bool = False,
                 **engine_args):
        self.rate, self.rate_control = dict(rate or {}), rate_control
        self.max_model_len, self.disable_log_stats = max_model_len, disable_log_stats
        self.engine_args = engine_args   # the rest (model, dtype, ...): recorded only
