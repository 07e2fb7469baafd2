"""Storage backends: one module each (memory, sqlite, postgres, mysql) behind one small ABC.

A backend module holds everything one kind of storage needs, behind
:class:`~little_es.backends.base.Backend`: the eventsourcing persistence
(factory and recorders, with the write-ahead commit policy), the row selector
of the read path, the artifact store, the run leases and the runs read model.
:mod:`little_es.world` opens a :class:`~little_es.world.World` on one;
:mod:`little_es.testing.backend` holds the conformance suite a new backend
passes. Modules here sit below the world: they import values, events, codec,
materialize and domain, never the world or anything above it.
"""
