"""Engine providers added beside squad's own: one module each.

A provider is an :class:`~squad.engine.provider.EngineProvider` (``open(workload, on_event)`` returns an
:class:`~squad.engine.provider.EngineHandle`); ``Squad(engine=MyProvider(...))`` takes it. squad's own are
:mod:`squad.engine.launched` (it starts llama-server) and :mod:`squad.engine.attached` (a running server).
This package sits in the composition-root layer (``tests/test_layering.py``): its modules may use the session,
admission and the chat client, which the rest of :mod:`squad.engine` may not.
"""
