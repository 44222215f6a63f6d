"""The reference scheduler: runs simulated jobs on the fleet and speaks the scheduler protocol
(EVI-8) that Slurm and Kubernetes adapters will speak."""
