"""Summarise ab_cli.sh's bench result files side by side: summary.py NAME... (each NAME-{base,head}-ROUND.json, in
this folder or in $AB_DIR)."""
import glob, json, os, sys
here = os.environ.get("AB_DIR") or os.path.dirname(os.path.abspath(__file__))
for name in sys.argv[1:]:
    for path in sorted(glob.glob(os.path.join(here, f"{name}-base-*.json"))):
        rnd = path.rsplit("-", 1)[1][:-5]
        b, h = (json.load(open(os.path.join(here, f"{name}-{side}-{rnd}.json"))) for side in ("base", "head"))
        cells = [f"{name} r{rnd} {b['prompt_tokens']} tok  full {b['ttft_s']['full']:.3f}/{h['ttft_s']['full']:.3f} s"]
        for m in b["ttft_s"]:
            if m.startswith("blend:") or m == "reuse":
                cells.append(f"{m.replace('blend:gradual', '')} {b['speedup_vs_full'][m]:.2f}x/{h['speedup_vs_full'][m]:.2f}x"
                             f" ({b['ttft_s'][m] * 1e3:.0f}/{h['ttft_s'][m] * 1e3:.0f} ms, paired {h['speedup_paired'][m]:.2f}x)")
        cells.append(f"acc full {b['accuracy']['full']:.2f}/{h['accuracy']['full']:.2f}")
        print("  ".join(cells))
