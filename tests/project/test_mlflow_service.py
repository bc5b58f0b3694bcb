"""`lehr mlflow-server` beyond this machine: MLflow answers only requests whose Host header it
allows (its guard against DNS rebinding), so lehr allows this machine's names and addresses; a
client elsewhere that names the machine is answered, one that names another host is not
(tests/project/test_team.py runs the server itself, on 127.0.0.1)."""

from __future__ import annotations

import socket

from lehr.project.mlflow_service import _loopback, _names_of_this_machine


def test_a_server_beyond_loopback_allows_this_machines_names_with_and_without_its_port():
    names = _names_of_this_machine("::", 5001)
    for name in (socket.gethostname(), "localhost"):
        assert name in names and f"{name}:5001" in names
    assert all(n.count(":") <= 1 for n in names)  # IPv4 addresses and names only
    assert "192.0.2.77:5001" in _names_of_this_machine("192.0.2.77", 5001)  # the address it was told


def test_only_loopback_counts_as_this_machine_only():
    assert _loopback("127.0.0.1") and _loopback("localhost") and _loopback("::1")
    assert not _loopback("::") and not _loopback(socket.gethostname()) and not _loopback("192.0.2.77")
