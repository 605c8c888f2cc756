"""The kernel: the durable loop of one agent. Knows nothing of definitions, memory or HTTP."""
