"""Two `ragkv bench quality` JSONs of the same prompts (argv: base, new): accuracy, agreement and KL per config,
and how many answers are the same text in both."""
import json, sys
base, new = (json.load(open(p)) for p in sys.argv[1:3])
for key in ("accuracy", "agreement_vs_full", "kl_vs_full"):
    print(key, {c: (round(base["overall"][key][c], 4), round(new["overall"][key][c], 4)) for c in base["overall"][key]})
same = total = 0
differ = []
for family, rows in base["answers"].items():
    for i, (a, b) in enumerate(zip(rows, new["answers"][family])):
        for config in a:
            total += 1
            if a[config] == b[config]:
                same += 1
            else:
                differ.append((family, i, config, a[config][:60], b[config][:60]))
print(f"answers with the same text: {same} of {total}")
for d in differ:
    print("  differs:", d)
