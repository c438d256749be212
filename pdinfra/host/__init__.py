"""The host layer: facts gathered once (facts), the check catalog judged against the cluster's expectations
(checks) and the physical link limits (linklimits). facts.py and its parts (facts_base, facts_gpu, facts_net)
import nothing else from pdinfra: they are also the Ansible module ``pdinfra_facts`` (module_utils/pdinfra_facts*.py
link to them)."""
