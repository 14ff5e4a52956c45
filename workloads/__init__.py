"""The allocation workload that runs inside Pods (CuPy on a GPU, the simulated device elsewhere)."""
