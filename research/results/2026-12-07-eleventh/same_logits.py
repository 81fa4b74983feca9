"""Compare two logits_dump.py files: same_logits.py A B -> per prefill, equal bit for bit or the largest difference."""
import sys
import torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
for key in a:
    same = torch.equal(a[key], b[key])
    print(f"{key}: {'equal' if same else f'max |diff| {(a[key] - b[key]).abs().max().item():.2e}'}")
