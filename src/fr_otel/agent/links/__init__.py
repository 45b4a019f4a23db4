"""How ranks reach each other: the job's store (bounded calls, keys, trust), the node folder and leader, the host map."""
