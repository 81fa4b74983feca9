"""Two builds of row_attention.c (argv: .so paths) alternated in one process on whole prompts and blend-like
scattered rows (SmolLM2's 9 query / 3 kv heads of 64): ms and ns per key-row, and each build's speed against the
first; every build checked against the first within 1e-5."""
import ctypes, statistics, sys, time, torch
libs = {}
for path in sys.argv[1:]:
    lib = ctypes.CDLL(path)
    lib.ragkv_attend_rows.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_float, ctypes.c_void_p]
    libs[path.split("/")[-1]] = lib
def run(lib, q, k, v, first, end):
    out = torch.empty(q.shape[1], q.shape[0] * q.shape[2])
    lib.ragkv_attend_rows(q.data_ptr(), q.shape[1], q.shape[0], k.data_ptr(), v.data_ptr(), k.shape[0], k.stride(0),
                          q.shape[2], first.data_ptr(), end.data_ptr(), 0.125, out.data_ptr())
    return out
torch.manual_seed(0)
cases = [(f"prompt {T} in order", torch.arange(T), T) for T in (128, 1116, 2118)]
for T, rows in ((1116, 25), (1116, 185), (1116, 560), (2118, 340)):
    w = torch.arange(T - 25).float() + 200
    qp = torch.cat([torch.sort(torch.multinomial(w, rows - 25)).values, torch.arange(T - 25, T)]) if rows > 25 else torch.arange(T - 25, T)
    cases.append((f"{rows} of {T} scattered", qp, T))
for name, qp, T in cases:
    kp = torch.arange(T)
    k, v, q = torch.randn(3, T, 64), torch.randn(3, T, 64), torch.randn(9, qp.numel(), 64)
    end = torch.searchsorted(kp, qp, right=True).int(); first = torch.zeros_like(end)
    ref = None
    for lib in libs.values():
        out = run(lib, q, k, v, first, end)
        ref = out if ref is None else ref
        assert (out - ref).abs().max() < 1e-5
    ts = {n: [] for n in libs}
    for _ in range(max(10, min(80, int(3e7 / (qp.numel() * T))))):
        for n, lib in libs.items():
            t = time.perf_counter(); run(lib, q, k, v, first, end); ts[n].append(time.perf_counter() - t)
    exact, base = int(end.sum()), statistics.median(next(iter(ts.values())))
    print(f"{name:22s}", "  ".join(f"{n} {statistics.median(x)*1e3:6.2f} ms {statistics.median(x)/exact*1e9:4.1f} ns x{base/statistics.median(x):.2f}" for n, x in ts.items()))
