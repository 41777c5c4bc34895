"""rlloss's benchmarks: a small package, and the scripts that run it.

* :mod:`benchmarks.harness` -- the one measurement harness: the timed levels, the equality gate,
  interleaved timing, one case's rows; the level and mode names every script uses.
* :mod:`benchmarks.records` -- what it prints and writes: text tables, the ``machine`` block of
  every result file, the JSON result.
* :mod:`benchmarks.cases` -- the cases, one module per family of losses, each with the
  hand-written plain-torch baseline beside its builders; shared builders in ``cases/common.py``.

The scripts, run from the repository root as ``python benchmarks/<script>.py``, parse their
arguments and call the package: ``overhead.py`` (``--ensemble-scaling`` included),
``instructions.py`` (callgrind), ``compile_report.py`` and ``report.py`` (BENCHMARKS.md, its
prose in ``page.md`` and its last section in ``misses.md``);
``compiled_update.py`` (``--device cuda`` on a GPU, with ``gpu_checks.sh``) and
``per_sampler.py`` time whole updates and the prioritized sampler. The learning table's runs are
the tutorials' own: ``tools/tutorial_runs.py`` (``benchmarks/results/learning*``).
"""
