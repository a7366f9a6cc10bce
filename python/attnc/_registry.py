"""Variants by key, for the torch ops (whose schema names a variant by a string).

Filled when an :class:`attnc.Attention` is created — outside any traced region, so a
``torch.compile``'d call finds its variant when the op's fake implementation runs — and
kept for the process, so a backward finds its variant after the caller dropped it."""

VARIANTS = {}

# The kernel of each variant's last launch, by key: two `Attention` objects of the same
# source share a key (and the ops find the first), so the receipt lives here, not on one.
LAST_KERNEL = {}

# Block masks by key (``bm<id>``), for the ops' schema, which names one by a string; held
# weakly: the caller's object decides how long a mask lives.
import weakref  # noqa: E402

BLOCK_MASKS = weakref.WeakValueDictionary()
