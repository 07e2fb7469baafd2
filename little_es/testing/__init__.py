"""Test support for little_es users, shipped with the library.

* :class:`ScriptedModel` / :class:`ScriptedReply` - a deterministic model that
  answers by turn (or by a function of the request) and counts its real calls;
* :mod:`little_es.testing.crash` - :class:`CrashRunner`, which kills a workflow
  for real (SIGKILL) right after a chosen append, in a forked child, and
  resumes it in another;
* :mod:`little_es.testing.logs` - :class:`RunWriter` and friends, which write
  realistic run logs through the real aggregates, for tests of readers;
* :mod:`little_es.testing.backend` - the conformance cases a storage backend
  passes (import it yourself: it needs the ``testing`` extra).
"""

from little_es.harness.model import ScriptedModel, ScriptedReply
from little_es.testing.crash import ChildResult, CrashRunner
from little_es.testing.logs import Call, RunWriter, priced, unpriced, write_agent_run

__all__ = [
    "Call",
    "ChildResult",
    "CrashRunner",
    "RunWriter",
    "ScriptedModel",
    "ScriptedReply",
    "priced",
    "unpriced",
    "write_agent_run",
]
