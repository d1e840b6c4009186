"""Scheduling: what runs together, how big the engine must be, and who goes next.

- ``workload``: which agent conversations run at the same time, with which budgets;
- ``planner`` (pure: one :class:`~squad.sched.facts.PlanFacts` in, a plan out; its rules in ``sizing`` and
  ``kv_fit``) and ``plan``: the :class:`~squad.sched.plan.EnginePlan`;
- ``memory``: what this machine can give the KV cache (the planner's one outside fact);
- ``admission``: the slot and pool books (:class:`~squad.sched.admission.Admission`);
- ``policy``: the queue order, a :class:`~squad.sched.policy.QueuePolicy` seam and its registry; each
  policy is a module of ``policies/`` (a new order is a new file); ``room``: what a policy is shown;
- ``share``: shared input, the prefix one fan-out's agents prefill once.
"""
