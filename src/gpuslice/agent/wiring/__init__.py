"""The adapters `agent.build` wires to an agent once its first plan is in force, one
concern per module: the plan's MPS daemons, metrics and probes, memory caps, the memory
guard, labels, and the Node's Events. Each reads the plan state and asks the front end,
never which front end it is."""
