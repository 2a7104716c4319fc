"""The server tests' shared servers: each configuration once, one server each per run.

A test asks for a server by its fixture (`default_server`, `fallback_server`,
`lora_server`); the pool (tests/helpers/pool.py) starts it on first use and stops it
after the last test that asks for it. Tests are ordered here by the server they use, so
each starts once, and within one server the tests marked `destructive` (they kill,
unload or stop what others use) run after the rest, by their `rank` (default 0), then
in file order; those that stop the server itself (`destructive(stops=True)`) run last.
A test that needs a server of its own still may start one
(tests.helpers.servers.start_server): the run's ledger (tests/helpers/ledger.py) counts
it against the budget, so it is a decision to name.
How to add a server test: tests/README.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.pool import Pool
from tests.server import configs

SERVER_TESTS = Path(__file__).resolve().parent
_BY_NAME = {config.name: config for config in configs.CONFIGS}


_pools: list[Pool] = []  # the session's pool, once made: the teardown hook stops from it


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    servers = Pool(lambda name: tmp_path_factory.mktemp(name.removesuffix("_server")))
    _pools.append(servers)
    yield servers
    servers.close()
    _pools.remove(servers)


def _pooled(config: configs.ServerConfig):
    @pytest.fixture(scope="session", name=config.name)
    def server(pool):
        return pool.get(config)

    server.__doc__ = f"The session's {config.name} (tests/server/configs.py)."
    return server


# One session fixture per configuration, named as the configuration: default_server, ...
for _config in configs.CONFIGS:
    globals()[_config.name] = _pooled(_config)


# -- ordering: by server, destructive tests last, and each server stopped after its last --


def configs_of(item) -> list[str]:
    """The pooled servers a test uses: its fixtures, or its `uses_server` marks (for a
    server chosen by a parameter, as the engine of the OpenAI conformance cases)."""
    names = [name for name in item.fixturenames if name in _BY_NAME]
    names += [m.args[0] for m in item.iter_markers("uses_server") if m.args[0] not in names]
    return names


def _order(item, index: int) -> tuple:
    names = configs_of(item)
    group = min((list(_BY_NAME).index(n) for n in names), default=len(_BY_NAME))
    mark = item.get_closest_marker("destructive")
    stage = 0 if mark is None else (2 if mark.kwargs.get("stops") else 1)
    rank = 0 if mark is None else mark.kwargs.get("rank", 0)
    return (group, stage, rank, index)


_last_user: dict[str, list[str]] = {}  # nodeid -> the servers to stop after it


def pytest_collection_modifyitems(config, items):
    places = [i for i, item in enumerate(items) if SERVER_TESTS in Path(str(item.fspath)).parents]
    ordered = sorted(places, key=lambda i: _order(items[i], i))
    for place, item in zip(places, [items[i] for i in ordered], strict=True):
        items[place] = item
    _last_user.clear()
    last: dict[str, str] = {}
    for item in items:
        for name in configs_of(item):
            last[name] = item.nodeid
    for name, nodeid in last.items():
        _last_user.setdefault(nodeid, []).append(name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for name in _last_user.get(item.nodeid, []):
        for pool in _pools:
            pool.release(name)
