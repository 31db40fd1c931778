"""controltable's benchmark suite (issue 6): ``benchmarks/run`` or ``python -m benchmarks.main``."""
