"""The router's unit tests run with a router secret in the environment, as every router
started by `trident serve` does (a router with tenants refuses to load without one);
tests of the secret's absence remove it themselves. `tenant_router` makes routers with
a tenants section (test_tenants.py, and over Redis test_tenant_redis.py)."""

import pytest

from tests.bls.test_model import make_router, router_modules
from trident_common.interface import ROUTER_SECRET_ENV

TEST_SECRET = "unit-test-router-secret-" + "0123456789abcdef" * 2


@pytest.fixture(autouse=True)
def router_secret(monkeypatch):
    monkeypatch.setenv(ROUTER_SECRET_ENV, TEST_SECRET)
    return TEST_SECRET


TENANTS = {
    "default": {"requests_per_minute": 100, "max_concurrent": 1},
    "limits": {"alice": {"tier": "premium", "requests_per_minute": 2}, "bob": {}},
    "unknown": "reject",
    "share_prefix_cache": ["bob"],
}


@pytest.fixture
def tenant_router(tmp_path, monkeypatch):
    """Routers from SPEC with a tenants section (TENANTS unless a test gives its own) and
    any other router settings (test_model.make_router)."""
    with router_modules() as module:
        monkeypatch.setattr(module, "FIRST_TOKEN_WATCH_S", 0.005)
        monkeypatch.setattr(module, "STREAM_WATCH_S", 0.005)
        models = []

        def make(backends, tenants=TENANTS, **router):
            return make_router(module, tmp_path, models, backends, tenants=tenants, **router)

        yield make
        for model in models:
            model.finalize()
