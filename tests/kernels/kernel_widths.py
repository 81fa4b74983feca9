"""The KIVI layout at every key/value width the kernels support (2, 3, 4 bits), rotated or not, without the
registry: the product registers kivi2 (and wk4v3 mixes widths); the other names are research's codecs."""

from __future__ import annotations

from kvstore.codecs import make_codec
from kvstore.codecs.kivi import widths_codec

ROTATED = {"key_group": 128, "value_group": 64, "rotate": True}
WIDTHS = {f"k{kb}v{vb}": widths_codec(f"k{kb}v{vb}", kb, vb, False, "test widths") for kb in (3, 4) for vb in (2, 3, 4)}
WIDTHS.update({f"hk{kb}v{vb}": widths_codec(f"hk{kb}v{vb}", kb, vb, True, "test widths, rotated", **ROTATED)
               for kb in (3, 4) for vb in (2, 3, 4)})


def codec(name: str, **params):
    """A registered codec by name, or one of WIDTHS."""
    return WIDTHS[name](**params) if name in WIDTHS else make_codec(name, **params)
