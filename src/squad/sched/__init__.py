"""Scheduling: what runs together, how big the engine must be, and who goes next.

- ``workload``: which agent conversations run at the same time, with which budgets;
- ``planner`` (pure, facts in, plan out) and ``plan``: the :class:`~squad.sched.plan.EnginePlan`;
- ``memory``: what this machine can give the KV cache (the planner's one outside fact);
- ``admission``: the slot and pool books (:class:`~squad.sched.admission.Admission`);
- ``policy``: the queue order, a :class:`~squad.sched.policy.QueuePolicy` seam (a new order is a new file);
- ``share``: shared input, the prefix one fan-out's agents prefill once.
"""
