"""#48's acceptance rows for bench result files: acceptance.py FILE... -> per file and ratio, blend TTFT against
1.3 x compute_fraction x full + reuse, reuse against 0.15 x full, and 0.15's speedup against 3.5x."""
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    t, cf = d["ttft_s"], d["compute_fraction"]
    full, reuse = t["full"], t["reuse"]
    cells = [f"{path.rsplit('/', 1)[-1]}: reuse/full {reuse / full:.3f} ({'met' if reuse <= 0.15 * full else 'MISSED'})"]
    for m in t:
        if m.startswith("blend:"):
            bound = 1.3 * cf[m] * full + reuse
            cells.append(f"{m.split('@')[1]}: {t[m]:.3f} <= {bound:.3f} {'met' if t[m] <= bound else 'MISSED'}")
    x = full / t["blend:gradual@0.15"]
    cells.append(f"0.15 speedup {x:.2f}x ({'met' if x >= 3.5 else 'missed'})")
    print("  ".join(cells))
