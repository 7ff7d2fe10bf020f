"""The benches' two errors, apart from what measures (workload imports torch and the model; `bertbench report`, which
reads results, neither): the exit-code policy's input error and runtime error of a bench."""


class BenchError(ValueError):
    """A bench setting or input file a user supplied is unusable; the message names it."""


class BenchRunFailed(RuntimeError):
    """A run the bench started (a contender, a data-creation job) failed; the message quotes why."""
