"""How far a timing can be trusted: the spread of repeated measurements and the machine's load around them.

Used by the benches and the demo alike (a figure a user reads from either shows its spread and says when the
machine was busy), so it lives beside the code they share rather than in either.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from bertbench.common.cpus import this_process_cpus

# ---- the spread of repeated measurements ----------------------------------------------------------------------------
#
# A figure measured several times is a Spread: its median (the figure), min, max, coefficient of variation (sample
# stdev / mean; None for one measurement) and count; printed "0.130 (0.021–0.209, CV 41%)". A bench result holds it
# as an object (bench/results.py); the demo's flat record as KEY, KEY_min, KEY_max and KEY_cv (Spread.flat).


def cv_text(cv: float) -> str:
    return f"{cv:.1%}" if cv < 0.1 else f"{cv:.0%}"


@dataclasses.dataclass(frozen=True)
class Spread:
    """Repeated measurements of one figure: the median (the figure), min, max, CV (sample stdev / mean; None for a
    single measurement) and the number of repeats."""

    median: float
    min: float
    max: float
    cv: float | None
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        values = list(values)
        mean = statistics.fmean(values)
        cv = statistics.stdev(values) / mean if len(values) > 1 and mean else None
        return cls(statistics.median(values), min(values), max(values), cv, len(values))

    @classmethod
    def of_rate(cls, amount: float, seconds: Sequence[float]) -> Spread:
        """The spread of a rate, `amount` per repeat over each repeat's seconds. Its median is amount / the median
        time, so that a rate and its time agree for an even number of repeats too."""
        rates = cls.of([amount / second for second in seconds])
        return dataclasses.replace(rates, median=amount / statistics.median(seconds))

    @classmethod
    def exact(cls, value: float) -> Spread:
        """A figure given or computed, not repeated: no spread."""
        return cls(value, value, value, None, 1)

    def scaled(self, factor: float) -> Spread:
        """The same measurements in another unit (ms from s); a negative factor swaps min and max."""
        low, high = sorted((self.min * factor, self.max * factor))
        return Spread(self.median * factor, low, high, self.cv, self.n)

    @property
    def noisy(self) -> bool:
        """Repeats that vary more than a quiet machine's do (BUSY_CV)."""
        return self.cv is not None and self.cv > BUSY_CV

    def flat(self, key: str) -> dict[str, Any]:
        """The spread as a flat record holds it: KEY (the median), KEY_min, KEY_max, KEY_cv."""
        return {key: self.median, f"{key}_min": self.min, f"{key}_max": self.max, f"{key}_cv": self.cv}

    def text(self, spec: str) -> str:
        """ "0.130 (0.021–0.209, CV 41%)"; the median alone without repeats."""
        if self.cv is None:
            return format(self.median, spec)
        return f"{self.median:{spec}} ({self.min:{spec}}–{self.max:{spec}}, CV {cv_text(self.cv)})"


@dataclasses.dataclass(frozen=True)
class Ratio:
    """One measured figure over another (a speedup, a slowdown, a step over its floor), with the larger CV of the
    two: above BUSY_CV the ratio is noisy, and says so wherever it is printed."""

    value: float
    inputs_cv: float | None

    @classmethod
    def of(cls, numerator: Spread | float, denominator: Spread | float) -> Ratio:
        cvs = [part.cv for part in (numerator, denominator) if isinstance(part, Spread) and part.cv is not None]
        median = [part.median if isinstance(part, Spread) else part for part in (numerator, denominator)]
        return cls(median[0] / median[1], max(cvs) if cvs else None)

    @property
    def noisy(self) -> bool:
        return self.inputs_cv is not None and self.inputs_cv > BUSY_CV

    def text(self, spec: str = ".2f", suffix: str = "x") -> str:
        """ "1.52x", or "0.75x (noisy: inputs' CV 109%)" when noisy."""
        mark = f" (noisy: inputs' CV {cv_text(self.inputs_cv)})" if self.noisy else ""
        return f"{self.value:{spec}}{suffix}{mark}"


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
    return len(this_process_cpus())


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


def noisy_warning(measured: Sequence[tuple[str, Spread | None]], what: str = "timings") -> str | None:
    """A warning when any of the `measured` figures (each a description of its setting and its Spread; None: not
    measured) varies above BUSY_CV: repeats of one setting that differ that much were disturbed (see BUSY_CV)."""
    spreads = [(setting, spread) for setting, spread in measured if spread is not None]
    noisy = [(setting, spread) for setting, spread in spreads if spread.noisy]
    if not noisy:
        return None
    setting, worst = max(noisy, key=lambda pair: pair[1].cv)
    return (
        f"noisy {what}: the repeats of {len(noisy)} of {len(spreads)} setting(s) vary by more than CV "
        f"{BUSY_CV:.0%} (up to {cv_text(worst.cv)}, {setting}), which a quiet machine does not "
        "show: the machine was busy or its clock changed; compare medians with care and run again when it is "
        "idle"
    )
