"""gpuconf's conformance checks and the ``gpuconf`` command line.

The checks (one module per capability) grow here; ``catalog.yaml`` lists them.
"""
