"""autocuda's benchmark (not part of the installed package): `python bench/run.py`, or `autocuda bench` in a checkout.

Modules: `workloads` (the models and their inputs), `systems` (ours and the peers), `measure` (clock, checks, the
four parts), `report` (table, summary, plot), `suite` (the options and one run). bench/README.md says what is
measured and how.
"""
