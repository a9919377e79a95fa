"""The chaos report's counts on doctored logs, and the cuttable Toxiproxy path on real sockets."""

from __future__ import annotations

import dataclasses
import socket
import threading

from astraflow.chaos.faults import CutLink
from astraflow.topology.toxiproxy import Toxiproxy
from astraflow.chaos.report import FaultRecord, conservation_counts, format_table, tasks_redone
from .test_invariants import _group, consistent_log


def test_a_consistent_log_loses_and_duplicates_nothing():
    assert conservation_counts(consistent_log()) == {"samples_lost": 0, "tasks_unanswered": 0,
                                                      "groups_unsettled": 0, "duplicates_trained": 0}


def test_lost_samples_and_duplicate_trainings_are_counted():
    log = consistent_log()
    # t1's group trained again in a third batch (not marked as a replay), t3's group never settled
    again = dataclasses.replace(log.batches[0], step=2, groups=[log.batches[0].groups[1]],
                                sources=[log.batches[0].sources[1]])
    first = dataclasses.replace(log.batches[1], groups=log.batches[1].groups[1:], sources=log.batches[1].sources[1:])
    log = dataclasses.replace(log, batches=[log.batches[0], first, again])
    counts = conservation_counts(log)
    assert counts["duplicates_trained"] == 1
    assert counts["groups_unsettled"] == 1 and counts["samples_lost"] == 1  # t3's one sample


def test_tasks_redone_unions_discarded_redelivered_and_twice_answered():
    log = consistent_log()
    # an aborted record of t0 at (0, 9), and t1 answered a second time (committed) at (1, 5)
    log = dataclasses.replace(log, groups=log.groups + [(1, 5, _group("t1"))])
    records = [(p, o, 2_000_000, g) for p, o, g in log.groups] + [(0, 9, 2_000_000, _group("t0"))]
    tasks_at = {(0, i): f"t{i}" for i in range(6)}
    fault = FaultRecord("sigkill", "raas-0", "step 1", started=1000.0, window={0: (3, 5)})  # t3, t4
    out = tasks_redone(log, records, tasks_at, [fault], "policy")
    # t3 and t4 were answered (by raas-0's restarted self: a SIGKILL) after the fault
    assert out == {"tasks_redone": 4, "rollouts_discarded": 1, "tasks_redelivered": 2, "tasks_answered_twice": 1}
    late = FaultRecord("sigstop", "raas-0", "step 1", started=5000.0, window={0: (3, 5)})
    assert tasks_redone(log, records, tasks_at, [late], "policy")["tasks_redelivered"] == 0  # answered before it


def test_the_table_names_every_fault_and_flags_losses():
    from astraflow.chaos.invariants import check
    from astraflow.chaos.report import build_report
    log = consistent_log()
    log = dataclasses.replace(log, drops=log.drops[:1])  # t5 neither batched nor dropped
    audit = check(log, 1)
    report = build_report(scenario="s.yaml", job="j", brokers=1, seed=0, started=0.0,
                          faults=[FaultRecord("partition", "raas-1", "40s", 10.0, 25.0, recovery_s=18.5)],
                          skipped=["faults[1] sigkill at step 9 (the job finished first)"], audit=audit,
                          counts=conservation_counts(log), redone={"tasks_redone": 0, "rollouts_discarded": 0,
                                                                   "tasks_redelivered": 0, "tasks_answered_twice": 0},
                          weights={"trainer": "ab", "nodes": {"raas-0": {"digest": "ab"}}, "mismatched": [],
                                   "match": True},
                          restarts={}, completed=True, error=None, run_dir="r")
    assert not report["ok"] and report["samples_lost"] == 1 and report["faults_by_kind"] == {"partition": 1}
    text = format_table(report)
    assert "partition" in text and "raas-1" in text and "18.5" in text
    assert "samples lost: 1  <-- must be 0" in text and "NOT injected: faults[1]" in text
    assert text.splitlines()[-1].endswith("FAIL")


def _echo_server() -> tuple[socket.socket, int]:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return

            def echo(c=conn):
                try:
                    while data := c.recv(1024):
                        c.sendall(data)
                except OSError:
                    pass
            threading.Thread(target=echo, daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_a_cut_proxy_passes_nothing_and_restoring_drops_the_cut_connections():
    srv, port = _echo_server()
    toxiproxy = Toxiproxy()
    proxy = CutLink(toxiproxy, port, "raas-0")
    try:
        c = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        c.sendall(b"ping")
        assert c.recv(16) == b"ping"
        proxy.cut()
        c.sendall(b"lost")
        c.settimeout(0.5)
        try:
            assert c.recv(16) == b""  # nothing comes back while cut
        except socket.timeout:
            pass
        fresh = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)  # accepted: a black hole
        fresh.sendall(b"hello")
        fresh.settimeout(0.5)
        try:
            assert fresh.recv(16) == b""
        except socket.timeout:
            pass
        proxy.restore()
        c.settimeout(2)
        try:
            assert c.recv(16) == b""  # the connection that lived through the cut is closed
        except ConnectionResetError:
            pass
        again = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        again.sendall(b"back")
        assert again.recv(16) == b"back"
    finally:
        proxy.close()
        toxiproxy.close()
        srv.close()
