"""The allocation workload that runs inside Pods (CuPy on a GPU, the simulated device elsewhere).

``python -m workloads.allocate`` runs a plan and reports (``allocate``, ``plan``, ``report``,
``backends``); ``simwire`` and ``simclient`` are the simulated device's protocol and client, kept
here because workload images carry them. Standard library only, so this directory alone is a
complete program; see README.md.
"""
