"""#48's bench rows from the final checkout's `ragkv bench blend` JSONs (argv): reuse's share of full, and each
blend ratio's TTFT against 1.3 x its compute fraction x full + reuse."""
import json, sys
for p in sys.argv[1:]:
    d = json.load(open(p)); t = d['ttft_s']; cf = d['compute_fraction']
    full, reuse = t['full'], t['reuse']
    checks = []
    for m in ('blend:gradual@0.15', 'blend:gradual@0.3', 'blend:gradual@0.5'):
        bound = 1.3 * cf[m] * full + reuse
        checks.append(f"{m[-4:]} {t[m]:.3f}<={bound:.3f} {'ok' if t[m] <= bound else 'MISS'} (cf {cf[m]:.3f})")
    print(p.split('/')[-1], f"reuse/full {reuse/full:.3f}", "; ".join(checks))
