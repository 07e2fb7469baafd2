"""The torture suite: a mixed workflow SIGKILLed again and again, resumed, and checked.

* :mod:`tests.torture.workflow` - the workflow under test (with a ``wait_for`` step the
  driver signals) and the outer loop; every step body, model call and tool call appends
  a line to a ledger outside the process before it returns;
* :mod:`tests.torture.child` - one process that runs (or resumes) one run of it;
* :mod:`tests.torture.driver` - kills children (timer, ``LITTLE_ES_CRASH_AFTER_APPENDS``,
  every append boundary), signals their wait, resumes them until the run completes;
  runs outer loops and forks of completed runs the same way;
* :mod:`tests.torture.checker` - what must hold after each completed run;
* ``python -m tests.torture --kills 1000 --world URL`` - the long version.

The engine is a seam (:class:`tests.torture.driver.Engine`): the local engine is the
only one today; a Temporal engine plugs in there.
"""
