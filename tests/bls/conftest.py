"""The router's unit tests run with a router secret in the environment, as every router
started by `trident serve` does (a router with tenants refuses to load without one);
tests of the secret's absence remove it themselves."""

import pytest

from trident_common.interface import ROUTER_SECRET_ENV

TEST_SECRET = "unit-test-router-secret-" + "0123456789abcdef" * 2


@pytest.fixture(autouse=True)
def router_secret(monkeypatch):
    monkeypatch.setenv(ROUTER_SECRET_ENV, TEST_SECRET)
    return TEST_SECRET
