"""The reference node agent: the GPU-fraction contract, backends and the simulated GPU."""
