"""The host validator: a catalog of small named checks over the facts from :mod:`pdinfra.host.facts`.

Each check takes ``(facts, expect)`` and returns a verdict ("pass", "warn", "fail" or "n/a") with the evidence
it read and, for anything but a pass, one plain-language remedy. The catalog table of docs/validation.md is
generated from it (``python -m pdinfra.host.docs --write``).

The package: :mod:`~pdinfra.host.checks.registry` (verdicts, the ``@check`` decorator, running the catalog),
:mod:`~pdinfra.host.checks.common` (helpers over facts), then one module per topic. Each topic module registers its
checks when it is imported; the catalog's order is ``registry.TOPICS`` (then each module's source order), whatever
the import order. The package's public names are here: import them from ``pdinfra.host.checks``.
"""

from __future__ import annotations

from pdinfra.cluster.expect import Expect, RdmaExpect, normalise_nvlink_version
from pdinfra.host.checks.cross_host import FLEET_CHECKS, FLEET_FUNCTIONS, run_fleet_checks
from pdinfra.host.checks.gpu import (
    MIN_CUDA_DRIVER,
    cuda_version,
    dmabuf_usable,
    driver_version,
    fabric,
    fabric_manager,
    gpu_count,
    gpu_pci_count,
    nouveau_absent,
    nvlink,
    open_module,
    p2p,
    pcie,
    peermem,
    persistence_mode,
)
from pdinfra.host.checks.gpu_health import (
    CLOCKS_FAIL,
    CLOCKS_FINE,
    CLOCKS_WARN,
    GPU_RESET,
    NVLINK_COUNTERS,
    XID_APPLICATION,
    XID_HARDWARE,
    gpu_clocks,
    gpu_ecc,
    gpu_nvlink_errors,
    gpu_row_remap,
    gpu_xid,
    nvswitch_sxid,
)
from pdinfra.host.checks.kernel import iommu, kernel_dmabuf_config, kernel_version, secure_boot
from pdinfra.host.checks.pcie_errors import pcie_aer
from pdinfra.host.checks.rdma import (
    IB_MTUS,
    ROCE_HEADER_BYTES,
    gpudirect_rdma,
    rdma_link_flaps,
    rdma_mtu,
    rdma_pcie,
    rdma_ports,
    rdma_qos,
    rdma_speed,
    roce_mtu,
    roce_v2_gid,
)
from pdinfra.host.checks.registry import (
    CATALOG,
    FAIL,
    LAYERS,
    NA,
    PASS,
    VERDICTS,
    WARN,
    Check,
    CheckResult,
    Facts,
    Outcome,
    check,
    fail,
    failed,
    na,
    ok,
    run_checks,
    run_one,
    warn,
)
from pdinfra.host.checks.serving import (
    LOCAL_HOSTS,
    PD_CONSISTENT_KEYS,
    ROLES,
    pd_consistency,
    pd_consistency_problems,
    serving_deep_health,
    serving_health,
    serving_toolchain,
)
from pdinfra.host.checks.ucx import (
    UCX_TLS_ALIASES,
    required_transports,
    ucx_env,
    ucx_tls_allows,
    ucx_transports,
)

__all__ = [
    # the machinery
    "CATALOG", "FAIL", "LAYERS", "NA", "PASS", "VERDICTS", "WARN", "Check", "CheckResult", "Facts", "Outcome",
    "check", "fail", "failed", "na", "ok", "run_checks", "run_one", "warn", "FLEET_CHECKS", "FLEET_FUNCTIONS",
    "run_fleet_checks",
    # the expectations (pdinfra.cluster.expect)
    "Expect", "RdmaExpect", "normalise_nvlink_version",
    # constants and helpers of the topic modules
    "CLOCKS_FAIL", "CLOCKS_FINE", "CLOCKS_WARN", "GPU_RESET", "IB_MTUS", "LOCAL_HOSTS", "MIN_CUDA_DRIVER",
    "NVLINK_COUNTERS", "PD_CONSISTENT_KEYS", "ROCE_HEADER_BYTES", "ROLES", "UCX_TLS_ALIASES", "XID_APPLICATION",
    "XID_HARDWARE", "pd_consistency_problems", "required_transports", "roce_mtu", "ucx_tls_allows",
    # the check functions, in catalog order
    "kernel_version", "kernel_dmabuf_config", "iommu", "secure_boot",
    "open_module", "driver_version", "nouveau_absent", "persistence_mode", "cuda_version", "peermem",
    "gpu_count", "gpu_pci_count", "nvlink", "p2p", "pcie", "fabric", "fabric_manager", "dmabuf_usable",
    "gpu_ecc", "gpu_row_remap", "gpu_clocks", "gpu_nvlink_errors", "gpu_xid", "nvswitch_sxid",
    "pcie_aer",
    "rdma_ports", "roce_v2_gid", "rdma_mtu", "rdma_speed", "rdma_pcie", "rdma_link_flaps", "rdma_qos",
    "gpudirect_rdma",
    "ucx_transports", "ucx_env",
    "serving_toolchain", "serving_health", "serving_deep_health", "pd_consistency",
]  # fmt: skip
