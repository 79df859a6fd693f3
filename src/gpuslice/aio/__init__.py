"""Mode-neutral asyncio and file-watching helpers that adapters and the agent share: waiting
unless stopped, first-of-N races, keyed locks, work run to its end, inotify directory
watches, socket identities and short-lived helper programs. No Kubernetes, no GPUs."""
