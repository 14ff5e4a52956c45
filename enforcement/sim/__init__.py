"""The reference agent's simulated-GPU backend: a device model per node, its socket server, tools.

Modules, each one concept: ``model`` (the GPUs of a node and the memory/compute semantics),
``messages`` (node-side typed messages), ``server`` (the device behind a client socket and an admin
socket; also the ``python -m enforcement.sim.server`` process), ``admin`` (the node side's client),
``process`` (start and stop a server process), ``topology`` (GPU lists and deterministic UUIDs),
and ``bin/nvidia-smi`` (the simulated ``nvidia-smi`` put first on a simulated container's PATH).
The wire protocol and the container-side client live in ``workloads.simwire`` and
``workloads.simclient`` because workload images carry them.

This module holds the names the node runtime and agent share, and imports nothing heavy, so that
importing a constant does not start anything.
"""

from __future__ import annotations

from pathlib import Path

from workloads.simwire import SIM_SOCKET_ENV, SIM_TOKEN_ENV

__all__ = [
    "ADMIN_SOCKET_NAME",
    "ADMIN_TOKEN_ENV",
    "ADMIN_TOKEN_FILE_NAME",
    "CLIENT_SOCKET_NAME",
    "SIM_SOCKET_ENV",
    "SIM_TOKEN_ENV",
    "SMI_BIN_DIR",
]

# Inside a socket directory (one per simulated node).
CLIENT_SOCKET_NAME = "client.sock"  # mode 0666: every container of the node connects here
ADMIN_SOCKET_NAME = "admin.sock"  # mode 0600: the node agent/runtime only
ADMIN_TOKEN_FILE_NAME = "admin.token"  # mode 0600; written only when the token was not given by env

# Node side only: the admin token the server requires on its admin socket. Whoever starts the server
# may choose it and pass it here (to the server and to the agent), so that it never touches disk.
ADMIN_TOKEN_ENV = "GPUCONF_SIM_ADMIN_TOKEN"

# Put this directory first on PATH of simulated containers: it holds the simulated nvidia-smi.
SMI_BIN_DIR = Path(__file__).resolve().parent / "bin"
