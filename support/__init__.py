"""What the tests (tests/) and the benchmarks (bench/) share: real servers started on
loopback (Redis, SeaweedFS S3), engine doubles that trident's real engine models run
against inside a real tritonserver, LoRA adapter folders, a recording gRPC stream client,
and bare BLS relays (the floor a benchmark reads the router's hop against).

Never shipped: setup.cfg's package list leaves it out, and no module of builder/, bls/,
engine_cache/ or python_backends/ imports it (tests/test_support_package.py checks that).
"""
