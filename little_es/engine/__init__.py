"""The engine layer: the IR walk, the restart checks, the one step executor, the local scheduler.

* :mod:`little_es.engine.walk` - which step runs next (sandbox-safe: Temporal's
  workflow code uses it too);
* :mod:`little_es.engine.integrity` - the restart checks run before a run resumes;
* :mod:`little_es.engine.executor` - what both engines do to run a step, over a
  small seam that writes the run's stream;
* :mod:`little_es.engine.local` - :func:`~little_es.engine.local.run_workflow`,
  the in-process scheduler: walk + executor + lease.
"""
