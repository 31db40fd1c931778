"""controltable's benchmark suite: ``benchmarks/run`` or ``python -m benchmarks.main``."""
