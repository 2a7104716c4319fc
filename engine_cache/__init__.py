"""Content-addressed TensorRT-LLM engine cache: a local tier and an S3 tier.

    key = engine_key(EngineInputs(checkpoint_digest(ckpt), build_args, "90", trtllm, trt))
    path, outcome = EngineCache(local_dir, "s3://bucket/engines").get_or_build(key, build, {})
"""
from engine_cache.cache import EngineCache, EntryInfo
from engine_cache.errors import CacheError
from engine_cache.key import CACHE_FORMAT_VERSION, EngineInputs, checkpoint_digest, engine_key

__all__ = ["CACHE_FORMAT_VERSION", "CacheError", "EngineCache", "EngineInputs", "EntryInfo",
           "checkpoint_digest", "engine_key"]
