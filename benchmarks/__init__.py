"""rlloss's benchmarks: a small package, and the scripts that run it.

* :mod:`benchmarks.harness` -- the overhead measurement: the timed levels, the equality gate,
  interleaved timing, one case's rows; the level and mode names every script uses.
* :mod:`benchmarks.cases` -- the cases, one module per family of losses, each with the
  hand-written plain-torch baseline beside its builders; shared builders in ``cases/common.py``.
* ``compile_report.py`` -- graphs, breaks, recompiles and compile times per loss.
* :mod:`benchmarks.profiling` -- where a step's time goes (cProfile) and its instruction count
  (callgrind).
* :mod:`benchmarks.learning_runs`, :mod:`benchmarks.torchrl_swap`,
  :mod:`benchmarks.learning_curves` -- the tutorials over seeds, with rlloss and with the TorchRL
  loss swapped in, and their curves.
* :mod:`benchmarks.pages` -- BENCHMARKS.md (the headline tables and the missed targets),
  rendered from ``benchmarks/results/*.json``.

The scripts, run from the repository root as ``python benchmarks/<script>.py``, parse their
arguments and call the package: ``overhead.py``, ``compile_report.py``, ``profile_overhead.py``,
``instructions.py``, ``learning.py`` and ``report.py``.
"""
