"""The virtual cluster's network: named network namespaces (`ip netns`), a bridge joining one veth per host,
the processes inside them, and their removal."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from firescale.testing.layout import ClusterLayout, VClusterError

NETNS = Path("/run/netns")


def named_namespaces() -> list[str]:
    """Every named network namespace on this machine."""
    return os.listdir(NETNS) if NETNS.is_dir() else []


def make_network(layout: ClusterLayout) -> None:
    """The bridge's namespace, then one namespace per host with eth0 on the bridge and the host's address."""
    net = layout.bridge_namespace
    _ip("netns", "add", net)
    _ip("-n", net, "link", "add", "br0", "type", "bridge")
    _ip("-n", net, "link", "set", "br0", "up")
    _ip("-n", net, "link", "set", "lo", "up")
    for host in layout.hosts:
        ns = layout.namespace(host)
        _ip("netns", "add", ns)
        # the pair is made inside the bridge's namespace and its peer moved straight into ns:
        # no interface ever appears in the root namespace
        _ip("-n", net, "link", "add", f"v-{host}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", net, "link", "set", f"v-{host}", "master", "br0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{layout.address(host)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")


def shape_link(namespace: str, gbits: float | None) -> None:
    """Make the host's eth0 send at most `gbits` Gbit/s (a token bucket, Linux's `tbf` queueing discipline), or,
    with None, as fast as the bridge carries it: a slower interconnect than a veth pair, whose wire time
    leaves the host's core free (a veth's own "wire" is a copy on the sending core)."""
    if gbits is None:
        if link_rate(namespace) != "unshaped":
            _tc("-n", namespace, "qdisc", "del", "dev", "eth0", "root")
        return
    check_link_rate(gbits)
    # The bucket holds at least one 64 KiB segment (veths hand over segments of up to 64 KiB) and 1 ms of
    # sending; the queue behind it holds 20 ms, enough for TCP to keep the link busy.
    burst = max(65536, round(gbits * 1e9 / 8 * 1e-3))
    _tc("-n", namespace, "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", f"{gbits * 1000:g}mbit",
        "burst", str(burst), "latency", "20ms")


def check_link_rate(gbits: float) -> None:
    if not 0 < gbits <= 1000:
        raise VClusterError(f"vcluster: a link of {gbits} Gbit/s asked for; give more than 0 and at most 1000")


def link_rate(namespace: str) -> str:
    """The rate the host's eth0 is shaped to as tc states it (e.g. "1Gbit"), or "unshaped"."""
    shown = subprocess.run(["tc", "-n", namespace, "qdisc", "show", "dev", "eth0"], capture_output=True,
                           text=True).stdout.split()
    return shown[shown.index("rate") + 1] if "tbf" in shown and "rate" in shown else "unshaped"


def delete_namespace(namespace: str) -> None:
    """`ip netns del`; whether it worked shows in `named_namespaces()`."""
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def namespace_refusal() -> str | None:
    """Why this machine cannot create a network namespace (what `ip netns add` said), or None when it can."""
    probe = f"fsprobe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return (made.stderr.strip() or str(made.returncode)) if made.returncode else None


def processes_in(namespaces: list[str]) -> list[int]:
    """Every process whose network namespace is one of `namespaces` (named under /run/netns)."""
    wanted = set()
    for ns in namespaces:
        try:
            st = os.stat(NETNS / ns)
        except OSError:
            continue
        wanted.add((st.st_dev, st.st_ino))
    found: list[int] = []
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in wanted:
            found.append(int(entry))
    return found


def _tc(*argv: str) -> None:
    proc = subprocess.run(["tc", *argv], capture_output=True, text=True)
    if proc.returncode:
        raise VClusterError(f"vcluster: `tc {' '.join(argv)}` failed: {proc.stderr.strip()}")


def _ip(*argv: str) -> None:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if proc.returncode:
        raise VClusterError(f"vcluster: `ip {' '.join(argv)}` failed: {proc.stderr.strip()}")
