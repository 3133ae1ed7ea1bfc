"""vast-manager's offer filter: the query string of `vastai search offers` (e.g. its default
`disk_space>=250 dph<=0.9 gpu_ram>12.5 cpu_ram>=240 cpu_cores>25 inet_down>100 cuda_vers>=13.0`)
turned into conditions in Vast's own terms, as the official CLI turns them: its aliases (`dph`,
`cuda_vers`), RAM in GB (×1000 to Vast's MB), `_` for spaces in GPU names, `in [a,b]` lists.
A term it cannot read is an error naming it, never a silently wider search."""

import math
import re
from typing import Any

# vast-manager's default filter (main.go's handleOffers).
DEFAULT_FILTER = ("disk_space>=250 dph<=0.9 gpu_ram>12.5 cpu_ram>=240 cpu_cores>25 "
                  "inet_down>100 cuda_vers>=13.0")
MAX_FILTER = 1000  # characters: a filter is a line someone typed

# The CLI's names for some columns.
ALIASES = {"dph": "dph_total", "cuda_vers": "cuda_max_good", "reliability2": "reliability",
           "display_active": "gpu_display_active", "dlperf_usd": "dlperf_per_dphtotal",
           "flops_usd": "flops_per_dphtotal"}
# Columns of words; every other column holds numbers (or true/false).
TEXT_COLUMNS = {"gpu_name", "geolocation", "cpu_arch", "gpu_arch", "driver_version",
                "mobo_name", "verification", "ubuntu_version", "datacenter"}
# Columns the CLI gives in GB that Vast keeps in MB.
GB_COLUMNS = {"gpu_ram", "cpu_ram", "gpu_total_ram"}
# The offer columns a search may filter on (the official client's `offers_fields`).
COLUMNS = {
    "bw_nvlink", "compute_cap", "cpu_arch", "cpu_cores", "cpu_cores_effective", "cpu_ghz",
    "cpu_ram", "cuda_max_good", "datacenter", "direct_port_count", "driver_version", "disk_bw",
    "disk_space", "dlperf", "dlperf_per_dphtotal", "dph_total", "duration", "external",
    "flops_per_dphtotal", "gpu_arch", "gpu_display_active", "gpu_frac", "gpu_mem_bw",
    "gpu_name", "gpu_ram", "gpu_total_ram", "gpu_max_power", "gpu_max_temp", "has_avx",
    "host_id", "id", "inet_down", "inet_down_cost", "inet_up", "inet_up_cost", "machine_id",
    "min_bid", "mobo_name", "num_gpus", "pci_gen", "pcie_bw", "reliability", "rentable",
    "rented", "storage_cost", "static_ip", "total_flops", "ubuntu_version", "verification",
    "verified", "vms_enabled", "geolocation", "cluster_id",
}
OPERATORS = {">=": "gte", "<=": "lte", "!=": "neq", "==": "eq", "=": "eq", ">": "gt", "<": "lt",
             "in": "in", "notin": "notin", "nin": "notin"}
TERM = re.compile(r"\s*(?P<column>[A-Za-z_][A-Za-z0-9_]*)\s*"
                  r"(?:(?P<cmp>>=|<=|!=|==|=|>|<)\s*(?P<value>[^\s\[\]]+)|"
                  r"\s(?P<set>in|notin|nin)\s*\[(?P<items>[^\]]*)\])\s*")


class FilterError(ValueError):
    """A filter term that cannot be read; the message names it."""


def conditions(text: str) -> tuple[tuple[str, str, Any], ...]:
    """The (column, operator, value) conditions of a CLI filter string."""
    if len(text) > MAX_FILTER:
        raise FilterError(f"the filter is longer than {MAX_FILTER} characters")
    found, at = [], 0
    while at < len(text):
        match = TERM.match(text, at)
        if match is None or match.end() == at:
            rest = text[at:].split()
            raise FilterError(f"cannot read {rest[0] if rest else text[at:]!r}: expected "
                              "column>=value, column=value or column in [a,b]")
        at = match.end()
        column = ALIASES.get(match["column"], match["column"])
        if column not in COLUMNS:
            raise FilterError(f"unknown column {match['column']!r}")
        if match["cmp"]:
            found.append((column, OPERATORS[match["cmp"]], _value(column, match["value"])))
        else:
            items = [item.strip() for item in match["items"].split(",") if item.strip()]
            found.append((column, OPERATORS[match["set"]], [_value(column, i) for i in items]))
    return tuple(found)


def _value(column: str, raw: str) -> Any:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        number = float(raw)
    except ValueError:
        if column not in TEXT_COLUMNS:
            unit = " of GB" if column in GB_COLUMNS else ""
            raise FilterError(f"{column}: {raw!r} is not a number{unit}") from None
        return raw.replace("_", " ") if column == "gpu_name" else raw
    if not math.isfinite(number):
        raise FilterError(f"{column}: {raw!r} is not a finite number")
    if column in GB_COLUMNS:
        number *= 1000
    return int(number) if number.is_integer() else number
