"""Parse UCX's ``UCX_PROTO_INFO=y`` tables: which transport UCX really chose for each transfer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------------------
# UCX_PROTO_INFO parsing
# --------------------------------------------------------------------------------------------------

_PREFIX = re.compile(r"^\[[\d.]+\]\s+\[[^\]]*\]\s+")
_LANE = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:\-]+)")
# Titles read "... from host memory to host", "... into cuda/GPU1 from cuda/dev[2]" (UCX 1.2x).
_PUT = re.compile(r"remote memory write by ucp_put\S*\s+from (\S+)(?: memory)? to (\S+)")
_GET = re.compile(r"remote memory read by ucp_get\S*\s+into (\S+)(?: memory)? from (\S+)")


@dataclass
class ProtoRow:
    lo: int
    hi: int | None  # None = inf
    description: str
    config: str

    @property
    def transports(self) -> list[str]:
        return [m.group(1) for m in _LANE.finditer(self.config)]

    def covers(self, size: int) -> bool:
        return self.lo <= size and (self.hi is None or size <= self.hi)


@dataclass
class ProtoTable:
    """One UCX_PROTO_INFO table: an endpoint configuration and one operation's protocols by size."""

    header: str
    title: str
    rows: list[ProtoRow] = field(default_factory=list)

    @property
    def is_self(self) -> bool:
        return " self cfg#" in f" {self.header}"

    @property
    def op(self) -> str | None:
        if _PUT.search(self.title):
            return "WRITE"
        if _GET.search(self.title):
            return "READ"
        return None

    @property
    def mems(self) -> tuple[str, str] | None:
        m = _PUT.search(self.title) or _GET.search(self.title)
        return (m.group(1).split("/")[0], m.group(2).split("/")[0]) if m else None


def _parse_range(text: str) -> tuple[int, int | None] | None:
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return int(text), int(text)
    m = re.fullmatch(r"(\d+)\.\.(\d+|inf)", text)
    if not m:
        return None
    return int(m.group(1)), None if m.group(2) == "inf" else int(m.group(2))


def parse_proto_info(text: str) -> list[ProtoTable]:
    """Read the protocol tables UCX prints with ``UCX_PROTO_INFO=y`` out of a process's output."""
    tables: list[ProtoTable] = []
    cells_seen: list[str] = []
    current: ProtoTable | None = None
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw).strip()
        if line.startswith("+"):
            continue
        if not (line.startswith("|") and line.endswith("|")):
            cells_seen = []
            current = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 1:
            cells_seen.append(cells[0])
            if len(cells_seen) == 2:
                current = ProtoTable(header=cells_seen[0], title=cells_seen[1])
                tables.append(current)
                cells_seen = []
            continue
        if current is None or len(cells) < 3 or cells[0] == "Range":
            continue
        rng = _parse_range(cells[0])
        if rng is None:
            continue
        current.rows.append(ProtoRow(rng[0], rng[1], cells[1], cells[-1]))
        cells_seen = []
    return tables


def select_transports(
    tables: list[ProtoTable], op: str, local_mem: str, remote_mem: str, size: int | None = None
) -> list[str]:
    """Transports UCX chose for ``op`` between two memory types ("host"/"cuda"), in order of appearance.

    Loopback ("self") endpoint tables are ignored, and so are tables for other memory types: a case whose
    table is missing reports no transport rather than a neighbour's. Rows are narrowed to the ones covering
    ``size`` when one does.
    """
    chosen = [t for t in tables if not t.is_self and t.op == op and t.mems == (local_mem, remote_mem)]
    out: list[str] = []
    for table in chosen:
        rows = table.rows
        if size is not None:
            rows = [r for r in rows if r.covers(size)] or rows
        for row in rows:
            for tl in row.transports:
                if tl not in out:
                    out.append(tl)
    return out
