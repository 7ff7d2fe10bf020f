"""How far a timing can be trusted: the spread of repeated measurements and the machine's load around them.

Used by the benches and the demo alike (a figure a user reads from either shows its spread and says when the
machine was busy), so it lives beside the code they share rather than in either.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# ---- the spread of repeated measurements ----------------------------------------------------------------------------
#
# A figure measured several times is reported in a JSON row as KEY (the median, as a single figure always was) with
# KEY_min, KEY_max and KEY_cv (the coefficient of variation, sample stdev / mean; null for one measurement) beside
# it, and in markdown as "0.130 (0.021–0.209, CV 41%)".


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max, coefficient of variation (None for a single value) and count of repeated measurements."""
    values = list(values)
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean if len(values) > 1 and mean else None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "cv": cv, "n": len(values)}


def rate_spread(amount: float, seconds: Sequence[float]) -> dict[str, Any]:
    """The spread of a rate (`amount` per repeat over each repeat's seconds). Its median is amount / the median
    time, so that a row's rate and time agree for an even number of repeats too; min, max and CV are the rates'."""
    return {**spread([amount / value for value in seconds]), "median": amount / statistics.median(seconds)}


def spread_fields(key: str, measured: Mapping[str, Any]) -> dict[str, Any]:
    """A spread as a JSON row holds it: KEY, KEY_min, KEY_max, KEY_cv."""
    return {
        key: measured["median"],
        f"{key}_min": measured["min"],
        f"{key}_max": measured["max"],
        f"{key}_cv": measured["cv"],
    }


def cv_text(cv: float) -> str:
    return f"{cv:.1%}" if cv < 0.1 else f"{cv:.0%}"


def spread_text(row: Mapping[str, Any], key: str, spec: str) -> str:
    """KEY of a row with its range and CV, "0.130 (0.021–0.209, CV 41%)"; KEY alone without a spread."""
    low, high, cv = row.get(f"{key}_min"), row.get(f"{key}_max"), row.get(f"{key}_cv")
    if low is None or high is None or cv is None:
        return format(row[key], spec)
    return f"{row[key]:{spec}} ({low:{spec}}–{high:{spec}}, CV {cv_text(cv)})"


# ---- a busy machine -----------------------------------------------------------------------------------------------

# A timed setting whose CV is above this was disturbed. Measured on this project's shared 2-core CPU (2026-11) with
# measure.time_steps as `throughput` runs it (2 warm-up + 5 timed steps; pre-training, batch 8, seq 128, 2 threads):
#   BERT-tiny (a 35 ms step), quiet machine (load average under 1, nothing else running): 27 settings, CV 3.2%-12.5%
#   (median 5.8%); with one competing `python -c 'while True: pass'`: 30 settings, CV median 57%, 25 of 30 above 20%;
#   under the other sessions' usual load (load average 3.7-8): 292 settings, CV median 29%, 54% above 20%.
#   BERT-mini (a 340 ms step), quiet: 16 settings, CV 1.7%-12.3% (median 6.3%); with the competing process: 16
#   settings, steps 2.7x slower but CV 6.7%-35% (median 13%), 3 of 16 above 20%.
# 20% is above every quiet setting, with a margin, and below most disturbed short steps. A steady competitor slows
# every long step alike, which a CV cannot see: the load average does (it reached 2.35 on the 2 cores within those
# 25 s), and it alone lags a minute behind (it stayed under 2 during the seconds-long BERT-tiny bursts): hence both.
BUSY_CV = 0.2


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, which a batch system or taskset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average: the runnable (and uninterruptible) tasks, averaged."""
    return os.getloadavg()[0]


class LoadWatch:
    """The machine's load around a measurement: sampled when made and again by `busy()`. A 1-minute load average
    above the cores available means something besides the measurement wanted the cores (the measurement's own threads
    count too, at most one per core)."""

    def __init__(self) -> None:
        self.cores = available_cores()
        self.loads = [load_average()]

    def busy(self, what: str = "the measurement") -> str | None:
        """A warning when the load before or after `what` was above the cores; None otherwise."""
        self.loads.append(load_average())
        if max(self.loads) <= self.cores:
            return None
        return (
            f"the machine was busy: the 1-minute load average was {self.loads[0]:.2f} before {what} and "
            f"{self.loads[-1]:.2f} after it, above the {self.cores} core(s) available to this process, so other "
            "work competed for the cores and the timings are slower and noisier than on an idle machine: run "
            "again when it is idle"
        )


def noisy_warning(
    rows: Sequence[Mapping[str, Any]], key: str, describe: Callable[[Mapping[str, Any]], str], what: str = "timings"
) -> str | None:
    """A warning when KEY_cv of any row is above BUSY_CV: repeats of one setting that differ that much were
    disturbed (see BUSY_CV)."""
    noisy = [row for row in rows if (row.get(f"{key}_cv") or 0) > BUSY_CV]
    if not noisy:
        return None
    worst = max(noisy, key=lambda row: row[f"{key}_cv"])
    return (
        f"noisy {what}: the repeats of {len(noisy)} of {len(rows)} setting(s) vary by more than CV "
        f"{BUSY_CV:.0%} (up to {cv_text(worst[f'{key}_cv'])}, {describe(worst)}), which a quiet machine does not "
        "show: the machine was busy or its clock changed; compare medians with care and run again when it is "
        "idle"
    )
