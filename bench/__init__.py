"""autocuda's benchmark, a package of the repository that imports autocuda (and is never imported by it; not in
the wheel). Run it from the repository's root: `python -m bench` (the suite), `python -m bench.network` and the
other scripts.

Modules: `workloads` (the models and their inputs), `systems` (ours and the peers), `measure` (clock, checks, the
four parts), `report` (table, summary, plot), `suite` (the options and one run). bench/README.md says what is
measured and how.
"""
