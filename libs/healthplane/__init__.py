"""Healthplane: node-health control plane for GPU and HPC clusters (shared library)."""

__version__ = "0.1.0"
