"""One line per `ragkv bench blend` JSON: full's TTFT, each mode's TTFT and speedup (and paired), accuracy."""
import json, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    t, s, p, a = d["ttft_s"], d["speedup_vs_full"], d["speedup_paired"], d["accuracy"]
    modes = [m for m in t if m.startswith("blend:") or m == "reuse"]
    print(path.split("/")[-1], f"tokens {d['prompt_tokens']} full {t['full']:.3f}",
          " ".join(f"{m.replace('blend:gradual', 'g')} {t[m]:.3f}s {s[m]:.2f}x/{p[m]:.2f}x" for m in modes),
          "acc", {m.replace("blend:gradual", "g"): round(a[m], 2) for m in ["full", *modes]})
