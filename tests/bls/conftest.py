"""The router's unit tests run with a router secret in the environment, as every router
started by `trident serve` does (a router with tenants refuses to load without one);
tests of the secret's absence remove it themselves. `tenant_router` makes routers with
a tenants section (test_tenants.py, and over Redis test_tenant_redis.py)."""

import json

import pytest

from builder.render.router_json import router_config
from builder.spec import parse_spec
from tests.bls.test_model import SPEC, BlsRequest, router_modules
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
    with router_modules() as module:
        monkeypatch.setattr(module, "FIRST_TOKEN_WATCH_S", 0.005)
        monkeypatch.setattr(module, "STREAM_WATCH_S", 0.005)
        models = []

        def make(backends, tenants=TENANTS, rules=None, **router):
            data = json.loads(json.dumps(SPEC))
            data["tenants"] = tenants
            if rules is not None:
                data["router"]["rules"] = rules
            data["router"].update(router)
            (tmp_path / "1").mkdir(exist_ok=True)
            (tmp_path / "1" / "router.json").write_text(
                json.dumps(router_config(parse_spec(data, "<test>")).to_dict())
            )
            BlsRequest.backends = {b.name: b for b in backends}
            model = module.TritonPythonModel()
            model.initialize({"model_repository": str(tmp_path), "model_version": "1"})
            models.append(model)
            return model

        yield make
        for model in models:
            model.finalize()
