"""Ansible's linear strategy run through Mitogen (the ``mitogen`` package; docs/decisions.md, D-ansible-mitogen).

ansible.cfg names this directory as the strategy plugin path, so the playbooks find Mitogen's
strategies wherever the virtualenv lives. Mitogen keeps one Python per host for the whole play
instead of starting Python and compiling Ansible's module code from a zip for every task on every
host; plays cost about half the CPU. Back to plain Ansible: ``strategy = linear`` in ansible.cfg
and ``strategy: free`` in site.yml.
"""

from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule

__all__ = ["StrategyModule"]
