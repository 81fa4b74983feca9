"""Answers of two `ragkv bench quality` JSON files, config by config: how many are the same text. argv: A B."""
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for config in a["configs"]:
    pairs = [(x[config], y[config]) for fam in a["answers"] for x, y in zip(a["answers"][fam], b["answers"][fam])]
    same = sum(x == y for x, y in pairs)
    print(f"{config}: {same}/{len(pairs)} answers the same; accuracy {a['overall']['accuracy'][config]:.3f} -> "
          f"{b['overall']['accuracy'][config]:.3f}")
