"""astraflow.benchmarks: each benchmark a script (``python -m astraflow.benchmarks.<name>``) that
prints one table and writes its JSON under ``results/``; a benchmark too large for one module
keeps its command line in ``<name>.py`` and its parts in ``<name>_*.py``; ``lib/`` holds what
several benchmarks share and imports none of them."""
