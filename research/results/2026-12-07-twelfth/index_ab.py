"""Advanced indexing against index_select / index_copy_ at the prefill's sizes (the same values; medians of 200):
a recomputing layer's K/V rows written into the cache (185 of 1,116), the layer input gathered when blend's
choice narrows (1,092 of 1,116 rows; 185 of 1,092), a deviation check's stored K/V rows."""
import statistics, time, torch


def med(fn, k=200):
    for _ in range(5):
        fn()
    ts = []
    for _ in range(k):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


torch.manual_seed(0)
with torch.inference_mode():
    cache, rows = torch.randn(3, 1116, 64), torch.randn(3, 185, 64)
    slots = torch.sort(torch.randperm(1116)[:185]).values
    hidden = torch.randn(1116, 576)
    wide = torch.sort(torch.randperm(1116)[:1092]).values
    narrow = torch.sort(torch.randperm(1092)[:185]).values

    def put():
        cache[:, slots] = rows

    cases = [("cache[:, slots] = k", put, "cache.index_copy_(1, slots, k)", lambda: cache.index_copy_(1, slots, rows)),
             ("hidden[1092 rows]", lambda: hidden[wide], "index_select", lambda: hidden.index_select(0, wide)),
             ("hidden[:1092][185 rows]", lambda: hidden[:1092][narrow], "index_select",
              lambda: hidden[:1092].index_select(0, narrow)),
             ("cache[:, 185 rows]", lambda: cache[:, slots], "index_select", lambda: cache.index_select(1, slots))]
    assert torch.equal(hidden[wide], hidden.index_select(0, wide)) and torch.equal(cache[:, slots], cache.index_select(1, slots))
    for a, fa, b, fb in cases:
        ta, tb = med(fa), med(fb)
        print(f"{a:>24}: {ta:7.1f} us   {b}: {tb:6.1f} us   ({ta / tb:.1f}x)")
