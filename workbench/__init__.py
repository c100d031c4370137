"""RL Workbench: configure, launch, watch and compare short RL post-training runs of LMs."""

__version__ = "0.1.0"
