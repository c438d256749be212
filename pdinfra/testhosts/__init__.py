"""Local test hosts: Debian 12 systemd-nspawn nodes in their own network namespaces (pdinfra.testhosts.nspawn)."""

from pdinfra.testhosts.nspawn import (
    BRIDGE,
    Link,
    TestHost,
    TestHostError,
    api_key_file,
    create,
    destroy,
    ensure_base,
    from_inventory,
    known_hosts,
    leftovers,
    running_pid,
    ssh_command,
    ssh_config,
    ssh_key,
)

__all__ = ["BRIDGE", "Link", "TestHost", "TestHostError", "api_key_file", "create", "destroy", "ensure_base",
           "from_inventory", "known_hosts", "leftovers", "running_pid", "ssh_command", "ssh_config",
           "ssh_key"]  # fmt: skip
