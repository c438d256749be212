"""The host layer: facts gathered once (facts), the check catalog judged against the cluster's expectations
(checks) and the physical link limits (linklimits). facts.py imports nothing from pdinfra: it is also the
Ansible module ``pdinfra_facts`` (module_utils/pdinfra_facts.py links to it)."""
