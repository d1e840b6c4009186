"""Fan-out beyond one engine: ``dispatch`` (map items over workers that may die, no cluster in it),
``ray`` (the Ray pool, worker and relay) and ``local`` (the Ray cluster of a ``--ray`` run)."""
