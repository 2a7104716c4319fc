"""The server tests' shared servers: each configuration once, one server each per run.

A test asks for a server by its fixture (`default_server`, `fallback_server`,
`sglang_server`, ...); the pool (tests/helpers/pool.py) serves it on first use and lets it go
after the last test that asks for it, its tritonserver then serving the next
configuration. Tests are ordered here by the server they use, so each is served once,
and within one server the tests marked `destructive` (they kill, unload or stop what
others use) run after the rest, by their `rank` (default 0), then in file order; those
that stop the server itself (`destructive(stops=True)`) run last, after every other
repository. A module with a repository of its own asks the `pool` fixture to serve it
(`pool.serve`, released when the module ends). A test that needs a tritonserver process
of its own still may start one (tests.helpers.servers.start_server): the run's ledger
(tests/helpers/ledger.py) counts it against the budget, so it is a decision to name.
How to add a server test: tests/README.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.nodeid import NodeId

from tests.helpers.pool import Pool
from tests.server import configs
from tests.server import served as served_process

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


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """The one `trident serve` subprocess of the tests whose subject is that process
    (tests/server/served.py); its drain test ends it, last."""
    yield from served_process.serve(tmp_path_factory.mktemp("served"))


# -- ordering: by server, destructive tests last, and each server stopped after its last --


def configs_of(item) -> list[str]:
    """The pooled servers a test uses: its fixtures, or its `uses_server` marks (for a
    server chosen by a parameter, as the engine of the OpenAI conformance cases)."""
    names = [name for name in item.fixturenames if name in _BY_NAME]
    names += [m.args[0] for m in item.iter_markers("uses_server") if m.args[0] not in names]
    return names


def _stops(item) -> bool:
    mark = item.get_closest_marker("destructive")
    return mark is not None and bool(mark.kwargs.get("stops"))


def _order(item, index: int, stopped: set[str]) -> tuple:
    """Tests by server: the configurations in their order in configs.CONFIGS, then the
    modules with repositories of their own, then the configurations whose server a test
    stops (so the pool's processes serve every other repository first)."""
    names = configs_of(item)
    rank_of = {name: i for i, name in enumerate(_BY_NAME)}
    places = [rank_of[n] + (len(_BY_NAME) + 1 if n in stopped else 0) for n in names]
    group = min(places, default=len(_BY_NAME))
    mark = item.get_closest_marker("destructive")
    stage = 0 if mark is None else (2 if _stops(item) else 1)
    rank = 0 if mark is None else mark.kwargs.get("rank", 0)
    return (group, stage, rank, index)


# The servers to stop after a test (kept on the item: pytest-xdist renames node ids).
_RELEASE = pytest.StashKey[list[str]]()

# Lanes for pytest-xdist (`make test` runs two workers, --dist loadgroup): each lane
# is one xdist group, so one worker runs all its tests in the order set here. The vLLM
# lane holds the servers with real vLLM engines and every test of a real engine: vLLM on
# CPU binds its engine to one core and leaves the other to the rest (the doubles'
# servers, in the servers lane, then the tests that start no server, spread over both
# workers as they come free). The S3 tests share one SeaweedFS, so one worker runs them.
VLLM_SERVERS = {config.name for config in configs.CONFIGS if config.real_vllm}


def lane(item) -> str | None:
    names = configs_of(item)
    if VLLM_SERVERS & set(names) or (not names and item.get_closest_marker("vllm")):
        return "vllm"
    if names or SERVER_TESTS in Path(str(item.fspath)).parents:
        return "servers"
    if item.get_closest_marker("s3"):
        return "s3"
    return None


LANES = ("vllm", "servers", "s3")  # the order they start in: the longest first


def _suffix(item, group: str) -> None:
    """The `@group` suffix of a node id, by which --dist loadgroup keeps a group on one
    worker. pytest-xdist 3.8 writes it to `item._nodeid`, which pytest 9.2 no longer
    reads (a node's id is `_id` there), so every group would be split across workers."""
    if "@" not in item.nodeid:
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


# First of the hooks: pytest-xdist's own (in each worker) reads the xdist_group marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    places = [i for i, item in enumerate(items) if SERVER_TESTS in Path(str(item.fspath)).parents]
    stopped = {name for i in places if _stops(items[i]) for name in configs_of(items[i])}
    ordered = sorted(places, key=lambda i: _order(items[i], i, stopped))
    for place, item in zip(places, [items[i] for i in ordered], strict=True):
        items[place] = item
    lanes = {id(item): lane(item) for item in items}
    grouping = getattr(config.option, "loadgroup", False)  # set in a --dist loadgroup worker
    for item in items:
        if lanes[id(item)] is not None:
            item.add_marker(pytest.mark.xdist_group(lanes[id(item)]))
            if grouping:
                _suffix(item, lanes[id(item)])
    # Each lane's tests first, the longest lane first (a stable sort keeps their order).
    rank = {name: i for i, name in enumerate(LANES)}
    items.sort(key=lambda item: rank.get(lanes[id(item)], len(LANES)))
    last: dict[str, pytest.Item] = {}
    for item in items:
        for name in configs_of(item):
            last[name] = item
    for name, item in last.items():
        item.stash.setdefault(_RELEASE, []).append(name)


DEATH_TAIL_LINES = 80  # of a dead server's log, in the report of the test that saw it


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test whose server died gets that server's last log lines in its report:
    the cause of a death (a stub's segfault, Triton's abort) is otherwise lost with the
    run's temporary folders."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for pool in _pools:
        for name, code, log in pool.deaths():
            text = log.read_text(errors="replace") if log is not None and log.exists() else ""
            tail = "\n".join(text.splitlines()[-DEATH_TAIL_LINES:]) or "(no log)"
            report.sections.append((f"{name}: tritonserver exited {code}; its log ends", tail))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for name in item.stash.get(_RELEASE, []):
        for pool in _pools:
            pool.release(name)
