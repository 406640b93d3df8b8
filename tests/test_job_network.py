"""Each job's own network, tested as an attacker would: a job reaches nothing of another
running job (its abstract unix socket, its 127.0.0.1 port, its algo-1:7777) and nothing
of the machine (its 127.0.0.1, whatever listens on 0.0.0.0 behind the bridge's gateway);
it does reach the outside through NAT, unless it is network-isolated; and several
torchrun jobs at once each have their algo-1:7777. Root only (network namespaces)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port, python_job, require, require_module, wait_for, wait_until
from trainport.jobs.service import JobService
from trainport.runners.netns import (
    NetworkMode,
    choose_network,
    netns_problem,
    network_tag,
    resolver_problem,
)
from trainport.runners.sandbox import sandbox_problem

TWO_HOSTS = {"InstanceType": "ml.m5.large", "InstanceCount": 2, "VolumeSizeInGB": 1}


@pytest.fixture
def own_networks() -> None:
    """Jobs get networks of their own here (root), and run in the sandbox."""
    require(netns_problem() is None, f"no network namespaces: {netns_problem()}")
    require(sandbox_problem() is None, f"no sandbox: {sandbox_problem()}")


def lines(service: JobService, name: str, host: str = "algo-1") -> list[str]:
    return [text for _, text in service.logs(name, host=host)]


def tagged(service: JobService, name: str, tag: str, host: str = "algo-1") -> list[str]:
    return [t[len(tag) + 1 :] for t in lines(service, name, host) if t.startswith(f"{tag} ")]


# Each target an attacker tries: "NAME HOST PORT" (HOST "@NAME": an abstract unix socket).
# Prints REACHED or FAILED for each.
PROBE = """
import os, socket, struct, sys

def gateway():
    for row in open('/proc/net/route').read().splitlines()[1:]:
        f = row.split()
        if f[1] == '00000000':
            return socket.inet_ntoa(struct.pack('=I', int(f[2], 16)))
    return None

def reach(name, host, port):
    if host == 'GATEWAY':
        host = gateway()
        if host is None:
            print(f'FAILED {name}: no route out', flush=True)
            return
    try:
        if host.startswith('@'):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(3)
            s.connect('\\0' + host[1:])
        else:
            s = socket.create_connection((host, int(port)), timeout=3)
        s.close()
        print(f'REACHED {name}', flush=True)
    except OSError as exc:
        print(f'FAILED {name}: {exc}', flush=True)

for target in os.environ['TARGETS'].split(','):
    reach(*target.split())
"""


# -- another running job -------------------------------------------------------------------

LISTENS = """
import os, select, signal, socket, sys, time
me = socket.gethostbyname('algo-1')
servers = {
    'abstract': socket.socket(socket.AF_UNIX, socket.SOCK_STREAM),
    'loopback': socket.socket(),
    'algo-1': socket.socket(),
}
servers['abstract'].bind('\\0' + os.environ['ABSTRACT'])
servers['loopback'].bind(('127.0.0.1', int(os.environ['PORT'])))
servers['algo-1'].bind((me, 7777))
for server in servers.values():
    server.listen()
# Each listens: the job reaches its own.
for name, server in servers.items():
    peer = socket.socket(server.family)
    peer.connect(server.getsockname() if name != 'abstract' else '\\0' + os.environ['ABSTRACT'])
    server.accept()[0].close()
    peer.close()
    print('OWN ' + name, flush=True)
print('LISTENING ' + me, flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:  # until stopped: whatever connects now is an intruder
    for server in select.select(list(servers.values()), [], [], 0.2)[0]:
        server.accept()[0].close()
        print('INTRUDER ' + next(n for n, s in servers.items() if s is server), flush=True)
"""


def test_a_job_reaches_nothing_of_another_running_job(
    service: JobService, own_networks: None
) -> None:
    port, abstract = free_port(), f"trainport-test-{os.getpid()}"
    env = {"PORT": str(port), "ABSTRACT": abstract}
    service.create(python_job("net-a", LISTENS, Environment=env), runner="sandbox")
    try:
        wait_until(
            lambda: (
                bool(tagged(service, "net-a", "LISTENING"))
                or service.get("net-a").status != "InProgress"
            ),
            timeout=60,
            what="job net-a listening",
        )
        (address,) = tagged(service, "net-a", "LISTENING")
        assert tagged(service, "net-a", "OWN") == ["abstract", "loopback", "algo-1"]
        assert address.startswith("10.")  # its address on its own bridge
        # Job B, while A listens, tries each of A's doors.
        targets = f"abstract @{abstract} 0,loopback 127.0.0.1 {port},algo-1 {address} 7777"
        body = python_job("net-b", PROBE, Environment={"TARGETS": targets})
        service.create(body, runner="sandbox")
        record = wait_for(service, "net-b", timeout=120)
        assert record.status == "Completed", record.failure_reason
        said = tagged(service, "net-b", "REACHED") + tagged(service, "net-b", "FAILED")
        assert [s.split(":")[0] for s in said] == ["abstract", "loopback", "algo-1"], said
        assert tagged(service, "net-b", "REACHED") == [], said
    finally:
        service.stop("net-a")
    assert wait_for(service, "net-a").status == "Stopped"
    assert tagged(service, "net-a", "INTRUDER") == []


# -- the machine ---------------------------------------------------------------------------


class _Listener:
    """A TCP server of the machine's, in a thread, that counts who connects."""

    def __init__(self, host: str) -> None:
        self.server = socket.create_server((host, 0))
        self.port = self.server.getsockname()[1]
        self.accepted: list[str] = []
        self.server.settimeout(0.2)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, peer = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(peer[0])
            conn.close()

    def close(self) -> None:
        self.done.set()
        self.thread.join()
        self.server.close()


@pytest.fixture
def machine_servers() -> Iterator[tuple[_Listener, _Listener]]:
    """A server on the machine's 127.0.0.1 and one on all its addresses (0.0.0.0)."""
    loopback, everywhere = _Listener("127.0.0.1"), _Listener("0.0.0.0")
    try:
        yield loopback, everywhere
    finally:
        loopback.close()
        everywhere.close()


def machine_address() -> str:
    """One of the machine's own non-loopback IPv4 addresses (not a job's bridge)."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    found = [
        line.split()[3].split("/")[0]
        for line in out.splitlines()
        if line.split()[1] != "lo" and not line.split()[1].startswith(("tpb", "tpv"))
    ]
    require(bool(found), "this machine has no non-loopback IPv4 address")
    return found[0]


def firewall_elements() -> str:
    done = subprocess.run(["nft", "list", "table", "inet", "trainport"], capture_output=True)
    return done.stdout.decode()


def test_a_job_reaches_nothing_of_the_machine(
    service: JobService, own_networks: None, machine_servers: tuple[_Listener, _Listener]
) -> None:
    loopback, everywhere = machine_servers
    targets = ",".join(
        [
            f"loopback 127.0.0.1 {loopback.port}",
            f"gateway GATEWAY {everywhere.port}",
            f"machine {machine_address()} {everywhere.port}",
        ]
    )
    body = python_job("net-machine", PROBE, Environment={"TARGETS": targets})
    service.create(body, runner="sandbox")
    record = wait_for(service, "net-machine", timeout=120)
    assert record.status == "Completed", record.failure_reason
    said = tagged(service, "net-machine", "FAILED")
    assert [s.split(":")[0] for s in said] == ["loopback", "gateway", "machine"], lines(
        service, "net-machine"
    )
    assert "no route out" not in " ".join(said)  # the gateway was there, and said nothing
    assert loopback.accepted == [] and everywhere.accepted == []
    # Its namespace, bridge and firewall elements went with it.
    assert record.supervisor is not None
    tag = network_tag("net-machine", record.supervisor[0])
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"tp-{tag}-" not in namespaces
    assert not Path(f"/sys/class/net/tpb{tag}").exists()
    assert f"tpb{tag}" not in firewall_elements()


# -- the outside ---------------------------------------------------------------------------

INDEX = "https://pypi.org/simple"
PIP = """
import os, subprocess, sys
argv = [sys.executable, '-m', 'pip', 'download', '--isolated', '--no-deps', '--no-cache-dir']
argv += ['--index-url', sys.argv[1], '--dest', '/tmp/wheels', 'six']
if len(sys.argv) > 2:
    argv += ['--cert', sys.argv[2]]
done = subprocess.run(argv, capture_output=True, text=True)
print(done.stdout[-2000:] + done.stderr[-2000:], flush=True)
print('WHEELS ' + ' '.join(os.listdir('/tmp/wheels') if os.path.isdir('/tmp/wheels') else []))
"""


def test_a_job_downloads_from_the_package_index_through_nat(
    service: JobService, own_networks: None
) -> None:
    """pip from the public index inside a job: its DNS and HTTPS through the NAT. (This
    machine's own pip configuration adds local file:// indexes; --isolated leaves them out,
    so only the network can bring the package.)"""
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
    except OSError as exc:
        require(False, f"this machine does not reach {INDEX} itself: {exc}")
    cert = os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
    args = [INDEX, *([cert] if Path(cert).is_file() else [])]
    body = python_job("net-pip", PIP)
    body["AlgorithmSpecification"]["ContainerEntrypoint"] += args
    service.create(body, runner="sandbox")
    record = wait_for(service, "net-pip", timeout=240)
    assert record.status == "Completed", record.failure_reason
    (wheels,) = tagged(service, "net-pip", "WHEELS")
    assert wheels.startswith("six-") and wheels.endswith(".whl"), lines(service, "net-pip")


# -- EnableNetworkIsolation ----------------------------------------------------------------

ISOLATED = (
    """
import json, os, socket, time
rc = json.load(open(os.environ['SAGEMAKER_BASE_DIR'] + '/input/config/resourceconfig.json'))
me = socket.gethostbyname('algo-1')
if rc['current_host'] == 'algo-1':
    server = socket.create_server((me, 7777))
    server.settimeout(60)
    conn, peer = server.accept()
    print('PEER ' + conn.recv(100).decode(), flush=True)
else:
    for _ in range(300):
        try:
            s = socket.create_connection((me, 7777), timeout=3)
            break
        except OSError:
            time.sleep(0.1)
    s.sendall(b'algo-2')
    s.close()
print('ROUTES %d' % (len(open('/proc/net/route').read().splitlines()) - 1), flush=True)
"""
    + PROBE
)


def test_an_isolated_jobs_hosts_reach_each_other_and_nothing_else(
    service: JobService, own_networks: None, machine_servers: tuple[_Listener, _Listener]
) -> None:
    loopback, everywhere = machine_servers
    resolver = next(
        (
            line.split()[1]
            for line in Path("/etc/resolv.conf").read_text().splitlines()
            if line.startswith("nameserver")
        ),
        "1.1.1.1",
    )
    targets = ",".join(
        [
            f"loopback 127.0.0.1 {loopback.port}",
            f"machine {machine_address()} {everywhere.port}",
            f"resolver {resolver} 53",
            "index pypi.org 443",
        ]
    )
    body = python_job(
        "net-isolated",
        ISOLATED,
        Environment={"TARGETS": targets},
        ResourceConfig=TWO_HOSTS,
        EnableNetworkIsolation=True,
    )
    service.create(body, runner="sandbox")
    record = wait_for(service, "net-isolated", timeout=120)
    assert record.status == "Completed", record.failure_reason
    assert tagged(service, "net-isolated", "PEER") == ["algo-2"]
    for host in ("algo-1", "algo-2"):
        assert tagged(service, "net-isolated", "ROUTES", host) == ["1"]  # its subnet only
        said = tagged(service, "net-isolated", "FAILED", host)
        assert [s.split(":")[0] for s in said] == ["loopback", "machine", "resolver", "index"]
    assert loopback.accepted == [] and everywhere.accepted == []


# -- several torchrun jobs at once ----------------------------------------------------------


@pytest.mark.slow
def test_three_torchrun_jobs_at_once_each_have_their_algo_1_7777(
    home: Path, service: JobService, own_networks: None
) -> None:
    require_module("torch")
    from tests.test_multihost import torch_job

    names = ("ddp-one", "ddp-two", "ddp-three")
    for name in names:
        service.create(torch_job(home, name, 2, 1), runner="sandbox")
    for name in names:
        record = wait_for(service, name, timeout=300)
        assert record.status == "Completed", (name, record.failure_reason)
        for host in ("algo-1", "algo-2"):
            (info,) = [t for t in lines(service, name, host) if "RANKINFO " in t]
            fields = dict(kv.split("=") for kv in info.split("RANKINFO ")[1].split())
            assert fields["MASTER_ADDR"] == "algo-1" and fields["MASTER_PORT"] == "7777"
            assert float(fields["sum"]) == 3.0


# -- the decision ---------------------------------------------------------------------------


def test_which_network_a_job_gets() -> None:
    def mode(
        runner: str = "sandbox",
        tag: str | None = None,
        isolated: bool = False,
        netns: str | None = None,
        firewall: str | None = None,
        docker: bool = False,
    ) -> tuple[NetworkMode, str | None]:
        return choose_network(
            runner=runner, tag=tag, isolated=isolated, netns=netns, firewall=firewall, docker=docker
        )

    assert mode() == (NetworkMode.BRIDGE, None)
    assert mode(runner="process", isolated=True) == (NetworkMode.BRIDGE, None)
    assert mode(runner="ray") == (NetworkMode.MACHINE, None)
    assert mode(tag="loopback")[0] is NetworkMode.MACHINE
    assert "trainport:network=loopback" in (mode(tag="loopback")[1] or "")
    assert mode(tag="loopback", isolated=True)[0] is NetworkMode.LOOPBACK
    assert mode(docker=True)[0] is NetworkMode.MACHINE
    assert mode(docker=True, isolated=True)[0] is NetworkMode.LOOPBACK
    root = "network namespaces for hosts need root"
    assert mode(netns=root) == (NetworkMode.MACHINE, root)
    assert mode(netns=root, isolated=True) == (NetworkMode.MACHINE, root)
    assert mode(firewall="nft is missing") == (NetworkMode.MACHINE, "nft is missing")
    assert mode(firewall="nft is missing", isolated=True)[0] is NetworkMode.LOOPBACK


def test_a_resolver_on_the_machines_loopback_is_named(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text("# systemd-resolved\nnameserver 127.0.0.53\noptions edns0\n")
    assert "127.0.0.53" in (resolver_problem(conf) or "")
    conf.write_text("nameserver 10.255.255.53\nsearch example\n")
    assert resolver_problem(conf) is None
    assert resolver_problem(tmp_path / "missing") is None


def test_the_note_when_hosts_share_the_machines_network(service: JobService) -> None:
    """Without namespaces (here: the opt-out), a multi-host job's status says its hosts
    share the machine's network."""
    body = python_job(
        "net-shared",
        "print('hi')",
        ResourceConfig=TWO_HOSTS,
        Tags=[{"Key": "trainport:network", "Value": "loopback"}],
    )
    service.create(body, runner="process")
    record = wait_for(service, "net-shared")
    assert record.status == "Completed", record.failure_reason
    training = [t.message for t in record.transitions if t.status == "Training"]
    assert any("share this machine's network" in m for m in training), training


# -- on a Ray node ----------------------------------------------------------------------------

MAKE_OVERLAY_AND_DIE = """
import os, sys
from trainport.runners.overlay import Overlay, OverlayHost
overlay = Overlay('10.123.45', 4242, {'algo-1': '127.0.0.1'}, 1400, False, ())
host = OverlayHost(overlay, 'algo-1').__enter__()
print(host.namespace, host.tag, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_job_network_whose_maker_died_is_removed_by_the_next(own_networks: None) -> None:
    """A Ray worker killed with its driver leaves its host's namespace, bridge and VXLAN
    device behind; the next host made on that node removes them."""
    from trainport.runners.overlay import remove_left_overlays

    made = subprocess.run(
        [sys.executable, "-c", MAKE_OVERLAY_AND_DIE], capture_output=True, text=True
    )
    assert made.returncode == -9, made.stderr
    namespace, tag = made.stdout.split()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert namespace in listed
    assert Path(f"/sys/class/net/tpb{tag}").exists() and Path(f"/sys/class/net/tpx{tag}").exists()
    assert f"tpb{tag}" in firewall_elements()
    assert namespace in remove_left_overlays()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert namespace not in listed
    assert not Path(f"/sys/class/net/tpb{tag}").exists()
    assert not Path(f"/sys/class/net/tpx{tag}").exists()
    assert f"tpb{tag}" not in firewall_elements()
