"""What several benchmarks share, so that each benchmark module holds only its own method.

* :mod:`.stats` — a number measured several times (:func:`~.stats.spread`: median, min, max
  and every run), paired ratios and the ``median (min–max)`` cell of a table;
* :mod:`.results` — where a result goes: one JSON per benchmark under ``benchmarks/results/``
  (or one section of it), stamped with the machine, the time and the load;
* :mod:`.run_metrics` — reading a finished run's ``metrics.jsonl`` and ``summary.json``;
* :mod:`.steady` — the steady-state window of a run (seconds per step from its trained
  steps, and the work each emulated resource did inside the window);
* :mod:`.emulated` — a run's emulated-device accounts (modelled seconds per resource, CPU
  share of the holds, episodes worked);
* :mod:`.device_split` — dealing emulated devices over pools and trainers at the lowest
  priced bound;
* :mod:`.child` — a baseline run as its own Python process, its result read back;
* :mod:`.table` — the console table's header rule and key/value rows.

Nothing here knows a particular benchmark's arms, tables or JSON layout, and nothing here
imports a benchmark module.
"""
