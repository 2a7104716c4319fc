"""The loop of `trident serve` that keeps models serving (builder.serve.keeper), on a
server double: the stubs are read from /proc (a process group with none), the models'
states and the reloads are the double's. The real thing: tests/server/test_blast_radius.py."""

from __future__ import annotations

import subprocess

from builder.serve import keeper, loading

NO_GROUP = 2**22 + 12345  # above pid_max's default: no process has this group


class Process:
    """Runs for `checks` watch intervals, then exits 0."""

    def __init__(self, checks: int):
        self.pid, self.left = NO_GROUP, checks

    def wait(self, timeout):
        self.left -= 1
        if self.left < 0:
            return 0
        raise subprocess.TimeoutExpired("tritonserver", timeout)


class Server:
    """Two models READY: `qa` runs in stubs and has none (it died), `qb` runs in none."""

    http_url = "http://127.0.0.1:1"
    admin_headers = {"trident-admin": "k" * 64}
    drain_folder = None  # no heartbeats: no stub is judged hung

    def __init__(self, checks: int):
        self.process = Process(checks)

    def ready_models(self):
        return {"qa", "qb"}

    def stub_models(self):
        return {"qa"}

    def metrics_text(self):
        return ""


def test_a_model_that_keeps_dying_is_reloaded_with_backoff_then_given_up(monkeypatch):
    unloads = []
    monkeypatch.setattr(
        keeper, "_unload_quietly", lambda url, model, headers: unloads.append((model, headers))
    )
    reloads, lines = [], []

    def reload_fails(url, model, headers):
        assert headers == Server.admin_headers  # Triton refuses model control without
        reloads.append(model)
        raise loading.LoadFailed("its initialize() raised")

    server = Server(checks=60)
    policy = keeper.Restarts(limit=2, first_delay_s=0, max_delay_s=0)
    lost: list[str] = []  # told of each death, before anything else (the frontend's)
    code = keeper.keep_serving(
        server,
        lines.append,
        interval_s=0.001,
        restarts=policy,
        reload_model=reload_fails,
        lost=lost.append,
    )
    assert code == 0  # returns when tritonserver exits
    assert lost == ["qa", "qa", "qa"]  # the death, then each failed reload
    assert reloads == ["qa", "qa"] and unloads == [("qa", Server.admin_headers)]
    assert lines[0] == (
        "trident serve: the stub of model 'qa' died; reloading it in 0 s (restart 1 of 2)"
    )
    assert lines[1] == (
        "trident serve: reloading model 'qa' failed: its initialize() "
        "raised; reloading it in 0 s (restart 2 of 2)"
    )
    assert lines[2].startswith("trident serve: reloading model 'qa' failed: ")
    assert lines[2].endswith(
        "giving up on model 'qa' after 2 restarts: it is unloaded, the other models keep serving"
    )
    assert len(lines) == 3  # given up: not watched any more


def test_a_reloaded_model_is_back_and_watched_again():
    lines, reloads = [], []
    server = Server(checks=40)
    code = keeper.keep_serving(
        server,
        lines.append,
        interval_s=0.001,
        restarts=keeper.Restarts(first_delay_s=0),
        reload_model=lambda url, model, headers: reloads.append(model),
    )
    assert code == 0
    # Still without a stub after each reload (a double): it is found dead again, so the
    # watch goes on after a reload, and counts the restarts.
    assert reloads[:2] == ["qa", "qa"]
    assert lines[1].startswith("trident serve: model 'qa' is back (reloaded in ")
    assert "(restart 2 of 5)" in lines[2]


def test_the_keepers_own_failures_never_end_it(monkeypatch):
    """Out of file descriptors (a connection flood in the same process), /proc cannot be
    read: the keeper says so once, keeps the server running, and watches again after."""
    failures = iter([OSError(24, "Too many open files", "/proc")] * 5)

    def stub_processes(pgid):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return {}

    monkeypatch.setattr(keeper, "stub_processes", stub_processes)
    lines, reloads = [], []
    code = keeper.keep_serving(
        Server(checks=20),
        lines.append,
        interval_s=0.001,
        restarts=keeper.Restarts(first_delay_s=0),
        reload_model=lambda url, model, headers: reloads.append(model),
    )
    assert code == 0  # it ran until tritonserver exited, not until its own trouble
    assert lines[0] == (
        "trident serve: the keeper cannot watch the models (OSError: [Errno 24] Too many "
        "open files: '/proc'); retrying"
    )
    assert lines[1] == "trident serve: the keeper watches the models again"
    assert reloads and reloads[0] == "qa"  # and then it found the dead stub as before


class ReloadedByHand(Server):
    """`qa` dies; two checks after the keeper gave it up (and unloaded it), an operator
    loads it again."""

    def __init__(self, checks: int):
        super().__init__(checks)
        self.unloaded_checks = None  # checks since the keeper's unload

    def ready_models(self):
        if self.unloaded_checks is None:
            return {"qa", "qb"}
        self.unloaded_checks += 1
        return {"qa", "qb"} if self.unloaded_checks > 2 else {"qb"}


def test_a_model_given_up_and_loaded_by_hand_is_watched_again(monkeypatch):
    server = ReloadedByHand(checks=80)
    monkeypatch.setattr(keeper, "_unload_quietly", lambda *_: setattr(server, "unloaded_checks", 0))
    lines, reloads = [], []

    def reload(url, model, headers):
        reloads.append(model)
        if len(reloads) == 1:
            raise loading.LoadFailed("its initialize() raised")

    code = keeper.keep_serving(
        server,
        lines.append,
        interval_s=0.001,
        restarts=keeper.Restarts(limit=1, first_delay_s=0, max_delay_s=0),
        reload_model=reload,
    )
    assert code == 0
    assert "giving up on model 'qa'" in lines[1]
    assert lines[2] == "trident serve: model 'qa' was loaded again; watching it again"
    # Watched again: still without a stub (a double), it is found dead and reloaded.
    assert lines[3].startswith("trident serve: the stub of model 'qa' died; reloading it")
    assert reloads[:2] == ["qa", "qa"]


def test_a_hung_stub_is_killed_then_reloaded_like_a_dead_one(monkeypatch, tmp_path):
    """A live stub of a READY model whose heartbeat is older than hang_s is killed (one
    line says so), and its model is reloaded once the stub is seen gone; a stub that beats
    is left alone. The real thing: tests/server/test_blast_radius.py (a SIGSTOPped
    router)."""
    import os
    import time

    from builder.serve.watch import Stub

    stubs = {7001: Stub(7001, "qa", "qa_0", 1), 7002: Stub(7002, "qb", "qb_0", 1)}
    monkeypatch.setattr(keeper, "stub_processes", lambda pgid: dict(stubs))
    stale = time.time() - 60
    (tmp_path / "alive.7001").touch()
    os.utime(tmp_path / "alive.7001", (stale, stale))
    (tmp_path / "alive.7002").touch()  # fresh

    class Beating(Server):
        drain_folder = tmp_path

        def stub_models(self):
            return {"qa", "qb"}

    kills, reloads, lines = [], [], []

    def kill(pid):
        kills.append(pid)
        del stubs[pid]  # the next look finds it gone

    def reload_model(url, model, headers):
        reloads.append(model)
        stubs[7003] = Stub(7003, "qa", "qa_0", 2)  # a fresh stub, not beating yet

    code = keeper.keep_serving(
        Beating(checks=10),
        lines.append,
        interval_s=0.001,
        restarts=keeper.Restarts(first_delay_s=0),
        reload_model=reload_model,
        hang_s=30.0,
        kill=kill,
    )
    assert code == 0
    assert kills == [7001] and reloads == ["qa"], lines
    assert lines[0] == (
        "trident serve: the stub of model 'qa' (instance qa_0) hangs: no Python ran in it "
        "for 60 s (its heartbeat); killing it"
    )
    assert lines[1].startswith(
        "trident serve: the stub of model 'qa' (instance qa_0) died; reloading it in 0 s"
    )
    assert lines[2].startswith("trident serve: model 'qa' is back") and len(lines) == 3
    assert not (tmp_path / "alive.7001").exists()  # judged once
