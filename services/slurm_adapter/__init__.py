"""The Slurm adapter: holds and gating become Slurm drains, Slurm's jobs become allocations,
eviction's directives become requeues and cancels (SLU, behind the EVI-8 protocol)."""
