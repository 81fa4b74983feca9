"""The tenth session's micro-benchmark timer: the median seconds of `n` calls after two warm-up calls."""
import statistics, time


def med(fn, n=30):
    fn(); fn(); ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)
