"""The simulated nvidia-smi, run as the executable a simulated container finds first on its PATH."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from enforcement.sim import SMI_BIN_DIR
from enforcement.sim.admin import client_spec
from enforcement.sim.model import SimNode
from enforcement.sim.server import DeviceServer
from enforcement.sim.testing import container_env, short_tempdir
from enforcement.sim.topology import make_gpus
from workloads.simwire import MiB, SimFault

SMI = str(SMI_BIN_DIR / "nvidia-smi")


@pytest.fixture
def server() -> Iterator[DeviceServer]:
    with short_tempdir() as d:
        node = SimNode("smi-node", make_gpus("smi-node", [81920, 81920, 81920]))
        with DeviceServer(node, d, log=lambda _line: None) as srv:
            yield srv


def smi(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # Through PATH, as a workload calls it: proves the bin dir works as the node runtime will use it.
    return subprocess.run(["nvidia-smi", *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def client_env(server: DeviceServer) -> dict[str, str]:
    node = server.node
    token = node.attach(client_spec("ns/pod/main", ["2", "0"], 20480, 40960)).token
    ctx, _ = node.open_context(token)
    node.alloc(ctx, 0, 1000 * MiB)  # ordinal 0 = node GPU 2
    # A neighbour's usage must not show up in this client's view.
    other, _ = node.open_context(node.attach(client_spec("ns/other/main", ["0"], 1024)).token)
    node.alloc(other, 0, 1024 * MiB)
    return container_env(server.client_socket, token)


def test_the_query_shows_only_the_clients_gpus_with_its_limit_and_its_own_usage(
    server: DeviceServer, client_env: dict[str, str]
) -> None:
    out = smi(client_env, "--query-gpu=index,uuid,memory.total,memory.used", "--format=csv,noheader,nounits")
    assert out.returncode == 0, out.stderr
    uuids = [g.uuid for g in server.node.gpus]
    assert out.stdout.splitlines() == [f"0, {uuids[2]}, 40960, 1000", f"1, {uuids[0]}, 40960, 0"]


def test_the_query_with_header_units_name_and_free(client_env: dict[str, str]) -> None:
    out = smi(client_env, "--query-gpu=index,name,memory.total,memory.used,memory.free,count", "--format=csv")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], count"
    assert lines[1] == "0, NVIDIA H100 80GB HBM3, 40960 MiB, 1000 MiB, 39960 MiB, 2"


def test_list_and_id_filter(server: DeviceServer, client_env: dict[str, str]) -> None:
    uuids = [g.uuid for g in server.node.gpus]
    out = smi(client_env, "-L")
    assert out.stdout.splitlines() == [
        f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuids[2]})",
        f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {uuids[0]})",
    ]
    out = smi(client_env, "-i", "1", "--query-gpu=uuid", "--format=csv,noheader")
    assert out.stdout.strip() == uuids[0]
    assert smi(client_env, "-i", "5", "-L").returncode == 6


def test_the_plain_table_says_simulated(client_env: dict[str, str]) -> None:
    out = smi(client_env)
    assert out.returncode == 0, out.stderr
    assert "SIMULATED" in out.stdout
    assert "ns/pod/main" in out.stdout
    assert "1000MiB / 40960MiB" in out.stdout


def test_an_unknown_field_or_format_is_refused_like_nvidia_smi(client_env: dict[str, str]) -> None:
    out = smi(client_env, "--query-gpu=index,temperature.gpu", "--format=csv")
    assert out.returncode == 2 and 'Field "temperature.gpu" is not a valid field to query.' in out.stderr
    assert smi(client_env, "--query-gpu=index", "--format=json").returncode == 2


def test_without_the_simulated_device_it_fails_like_a_missing_driver() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCONF_SIM_")}
    out = subprocess.run([SMI, "-L"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stderr and "simulated" in out.stderr


def test_a_faulted_client_cannot_read_its_devices(server: DeviceServer, client_env: dict[str, str]) -> None:
    token = client_env["GPUCONF_SIM_TOKEN"]
    ctx, _ = server.node.open_context(token)
    with pytest.raises(SimFault, match="illegal memory access"):
        server.node.fault(ctx, 0)
    out = smi(client_env, "-L")
    assert out.returncode == 9 and "illegal memory access" in out.stderr
