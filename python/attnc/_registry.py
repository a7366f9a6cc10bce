"""Variants by key, for the torch ops (whose schema names a variant by a string).

Filled when an :class:`attnc.Attention` is created — outside any traced region, so a
``torch.compile``'d call finds its variant when the op's fake implementation runs — and
kept for the process, so a backward finds its variant after the caller dropped it."""

VARIANTS = {}

# Block masks by key (``bm<id>``), for the ops' schema, which names one by a string; held
# weakly: the caller's object decides how long a mask lives.
import weakref  # noqa: E402

BLOCK_MASKS = weakref.WeakValueDictionary()
