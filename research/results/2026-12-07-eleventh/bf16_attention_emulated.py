"""What bf16 attention would do to answers, before writing a kernel: `ragkv bench quality` with the row kernel's
inputs (queries, keys, values) rounded to bf16 and back (the products then as a bf16 dot-product kernel would take
them; the softmax weights stay fp32, so this is the optimistic side). argv: the bench's own arguments."""
import sys
import torch
import workers.row_attention as row_attention
from ragkv.cli import main

exact = row_attention.attend_rows


def rounded(q, keys, values, first, end, scale):
    bf = lambda x: x.to(torch.bfloat16).float()  # noqa: E731
    return exact(bf(q), bf(keys), bf(values), first, end, scale)


row_attention.attend_rows = rounded
main(sys.argv[1:])
