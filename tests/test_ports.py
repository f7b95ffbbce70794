"""The tests' own port draw (tests/servers.py): outside the kernel's ephemeral range and Ray's worker ports, never
the same port twice in one process, and each xdist worker in its own residue class."""
from __future__ import annotations

import socket

import pytest

import servers
from servers import RAY_WORKER_PORTS, free_port, quiet_ports


def test_drawn_ports_are_free_distinct_and_clear_of_the_kernels_and_rays_ranges():
    low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    if len(quiet_ports()) < 1000:
        pytest.skip(f"this machine's kernel hands out ports {low}-{high}: no quiet range to draw from")
    drawn = [free_port() for _ in range(40)]
    assert len(set(drawn)) == 40
    for port in drawn:
        assert not low <= port <= high and port not in RAY_WORKER_PORTS and port in quiet_ports()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_each_worker_draws_from_its_own_class(monkeypatch):
    monkeypatch.setattr(servers, "_handed", set())
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    for worker in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        assert {free_port() % 3 for _ in range(10)} == {worker}
