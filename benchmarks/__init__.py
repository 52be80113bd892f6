"""tfdist's benchmarks: ``python -m benchmarks list`` names them (see :mod:`benchmarks.harness` for their shape)."""
