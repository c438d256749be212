"""The KV connector in effect, for the roles' templates: thin filters over pdinfra.cluster.connectors.

``connector | pdinfra_kv(layout)``: the connector's flags under the layout (its router, bootstrap servers, transfer
engine, config file, packages; docs/connectors.md). ``instance | pdinfra_kv_transfer_config(connector, layout,
knobs)``: the instance's ``--kv-transfer-config`` (None when it needs none). The templates print what these return;
no role compares a connector's name.
"""

from __future__ import annotations

from typing import Any

try:  # pragma: no cover - exercised only inside Ansible
    from ansible.errors import AnsibleFilterError as _FilterError
except ImportError:  # pragma: no cover
    _FilterError = ValueError

from pdinfra.cluster import connectors


def pdinfra_kv(connector: str, layout: str = "pd") -> dict[str, Any]:
    try:
        return connectors.get(connector).in_effect(str(layout))
    except KeyError as exc:
        raise _FilterError(str(exc)) from exc


def pdinfra_kv_transfer_config(instance: dict, connector: str, layout: str, knobs: dict) -> dict[str, Any] | None:
    try:
        return connectors.kv_transfer_config(connector, str(layout), instance, knobs)
    except KeyError as exc:
        raise _FilterError(f"pdinfra_kv_transfer_config: {exc}") from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"pdinfra_kv": pdinfra_kv, "pdinfra_kv_transfer_config": pdinfra_kv_transfer_config}
