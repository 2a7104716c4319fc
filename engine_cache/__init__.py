"""Content-addressed TensorRT-LLM engine cache: a local tier and an S3 tier.

    key = engine_key(EngineInputs(checkpoint_digest(ckpt), build_args, "90", trtllm, trt))
    path, outcome = EngineCache(local_dir, "s3://bucket/engines").get_or_build(key, build, {})

Self-contained: nothing of trident's is imported, and boto3 only once an S3 tier is opened.
"""

from engine_cache.cache import EngineCache, EntryInfo
from engine_cache.errors import CacheError
from engine_cache.key import CACHE_FORMAT_VERSION, EngineInputs, checkpoint_digest, engine_key
from engine_cache.location import S3Location, parse_s3_uri

__all__ = [
    "CACHE_FORMAT_VERSION",
    "CacheError",
    "EngineCache",
    "EngineInputs",
    "EntryInfo",
    "S3Location",
    "checkpoint_digest",
    "engine_key",
    "parse_s3_uri",
]
