"""Ansible's free strategy run through Mitogen: see mitogen_linear.py beside this file."""

from ansible_mitogen.plugins.strategy.mitogen_free import StrategyModule

__all__ = ["StrategyModule"]
