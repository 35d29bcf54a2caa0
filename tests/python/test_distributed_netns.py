"""DDP over simdev across two network namespaces, as across two hosts: a veth
pair between two `ip netns` made and removed here, one torchrun agent in
each (`--nnodes 2 --nproc-per-node 1`), rendezvous through torchrun's c10d
store on the first namespace's address; trains to the parameters of one CPU
process (tests/python/ddp_train.py). Needs root and a kernel that lets it
make namespaces; skipped, saying why, elsewhere. Runs in one memory mode
(host-visible): the other adds nothing to the network path.

What a run across namespaces (or hosts) needs, beyond the single-host run:
- `--local-addr <this node's address>`: torchrun publishes the address of
  the first node for the workers (MASTER_ADDR) and, without it, that is the
  machine's host name, which resolves to an address (the host's own
  interface) that the other namespace cannot reach;
- `GLOO_SOCKET_IFNAME=<the interface between them>` (gloo's device binds to
  the host name's address otherwise);
- `--rdzv-conf is_host=1` on the node whose address is the endpoint (torchrun
  decides whether to host the store by matching the endpoint against the
  host name's addresses, which do not include the veth's);
- loopback up in each namespace.
The vendor collective slot is off (ACCELKIT_NATIVE_COLLECTIVES=0): both
namespaces share this host's shared memory, and the point is the network."""
import os
import shutil
import subprocess
import sys

import pytest

if os.environ.get("ACCELKIT_TEST_BACKEND", "simdev") != "simdev":
    pytest.skip("the distributed tests run on simdev", allow_module_level=True)
if os.environ.get("SIMDEV_HOST_VISIBLE") == "0":
    pytest.skip("one memory mode is enough for the network path", allow_module_level=True)

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import ddp_train  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "ddp_train.py")
PORT = 29555


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def namespaces():
    """Two namespaces joined by a veth pair named `akv` on both sides,
    10.99.0.1/24 and 10.99.0.2/24, loopback up; removed afterwards."""
    if not dist.is_available():
        pytest.skip("torch.distributed unavailable")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2)")
    if os.geteuid() != 0:
        pytest.skip("making network namespaces needs root")
    names = [f"akt{os.getpid()}a", f"akt{os.getpid()}b"]
    made = []
    try:
        for n in names:
            r = _ip("netns", "add", n, check=False)
            if r.returncode != 0:
                pytest.skip(f"`ip netns add` is not permitted here: {r.stderr.strip()}")
            made.append(n)
        _ip("link", "add", "akva", "netns", names[0], "type", "veth", "peer", "name", "akvb",
            "netns", names[1])
        for n, end, addr in zip(names, ("akva", "akvb"), ("10.99.0.1/24", "10.99.0.2/24")):
            _ip("-n", n, "link", "set", end, "name", "akv")
            _ip("-n", n, "addr", "add", addr, "dev", "akv")
            _ip("-n", n, "link", "set", "lo", "up")
            _ip("-n", n, "link", "set", "akv", "up")
        yield names
    finally:
        for n in made:
            _ip("netns", "del", n, check=False)  # the veth pair goes with them


def test_ddp_across_two_network_namespaces(tmp_path, namespaces):
    out = tmp_path / "params.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="akv",
               ACCELKIT_NATIVE_COLLECTIVES="0")
    env.pop("SIMDEV_VISIBLE_DEVICES", None)
    procs = []
    for rank, (ns, addr) in enumerate(zip(namespaces, ("10.99.0.1", "10.99.0.2"))):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run",
               "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"10.99.0.1:{PORT}",
               "--rdzv-id", f"akt{os.getpid()}", "--rdzv-conf", f"is_host={int(rank == 0)}",
               "--local-addr", addr, "--max-restarts", "0", SCRIPT, str(out)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"node {rank}:\n{log[-3000:]}"
    got = torch.load(out)
    got.pop("_devices")
    want = ddp_train.train(ddp_train.model(), "cpu").state_dict()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=k)
