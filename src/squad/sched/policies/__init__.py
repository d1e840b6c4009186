"""Queue policies, one per module: :mod:`~squad.sched.policies.fifo`,
:mod:`~squad.sched.policies.backfill`, :mod:`~squad.sched.policies.program`.

A new order is a new module here with a class that has the
:class:`~squad.sched.policy.QueuePolicy` methods; name it in
:data:`squad.sched.policy.QUEUE_POLICIES` to make it selectable by name (``queue="..."``), or
pass an instance to :class:`~squad.sched.admission.Admission` (``queue=``).
"""
