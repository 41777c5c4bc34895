"""rlloss's benchmarks: a small package, and the scripts that run it.

* :mod:`benchmarks.harness` -- the one measurement harness: the timed levels, the equality gate,
  interleaved timing, one case's rows; the level and mode names every script uses.
* :mod:`benchmarks.records` -- what it prints and writes: text tables, the ``machine`` block of
  every result file, the JSON result.
* :mod:`benchmarks.cases` -- the cases, one module per family of losses, each with the
  hand-written plain-torch baseline beside its builders; shared builders in ``cases/common.py``.
* :mod:`benchmarks.profiling` -- where a step's time goes (cProfile) and its instruction count
  (callgrind), for ``profile_overhead.py`` and ``instructions.py``.
* :mod:`benchmarks.learning_runs`, :mod:`benchmarks.learning_tasks`,
  :mod:`benchmarks.learning_curves`, :mod:`benchmarks.torchrl_swap` -- the tutorials over seeds,
  with rlloss and with the TorchRL loss swapped in, and their figures.
* :mod:`benchmarks.pages` -- BENCHMARKS.md's tables, rendered from ``benchmarks/results/*.json``,
  and its last section, the missed targets explained (``benchmarks/misses.md``, by hand).

The scripts, run from the repository root as ``python benchmarks/<script>.py``, parse their
arguments and call the package: ``overhead.py`` (``--ensemble-scaling`` included),
``instructions.py``, ``profile_overhead.py``, ``compile_report.py``, ``learning.py``
(``--rnd-runs`` included) and ``report.py``; ``compiled_update.py``, ``gpu_update.py`` (a CUDA
machine, with ``gpu_checks.sh``) and ``per_sampler.py`` time whole updates and the prioritized
sampler.
"""
