"""Host time per call of the Python package, by piece (run on a CUDA machine).

A 1-token decode over 256 keys (32/8 heads, d128), whose GPU work is microseconds: each row
is the median (min-max) over rounds of 100 calls, each round started on an idle GPU so
that the host never waits on the launch queue (`one_round`), the rows measured
round-robin (`interleaved`). Prints a table; writes JSON to argv[1] when given.

The pieces: the whole eager call; the Rust `Kernel.forward_torch` alone (reading Q, K, V,
allocating O, validating through the launch memo, one launch, the receipt); the same
launch with O given (no allocation); PyTorch's allocation of O alone; the current-stream
lookup; and beside them SDPA and, when importable, FlashAttention-4's `flash_attn_func`
in the same process.
"""

import json
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import attnc
import attnc.torch as at


def one_round(fn, n=100):
    """Host microseconds per call over `n` calls started on an idle GPU: a round queues
    fewer launches than the driver's queue holds, so the host never waits for the GPU (a
    long loop would measure the GPU's rate once the queue fills, whenever the GPU work
    outlasts the host's)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def host_us(fn, rounds=101):
    """The median of `rounds` rounds of `one_round`, after a warm-up."""
    for _ in range(50):
        fn()
    return round(statistics.median(one_round(fn) for _ in range(rounds)), 2)


def interleaved(pieces, reps=41):
    """Host µs per call of each piece, measured round-robin (one round of each piece per
    repetition) so that a change in the machine's speed during the run (seen between
    runs: every row 1.4x slower at times) touches all rows alike; median, min and max
    per piece. A piece that fails (an older package lacks it) is reported as its error."""
    samples, errors = {name: [] for name, _ in pieces}, {}
    for name, fn in pieces:
        try:
            for _ in range(50):
                fn()
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {e}"[:200]
    for _ in range(reps):
        for name, fn in pieces:
            if name not in errors:
                samples[name].append(one_round(fn))
    out = {}
    for name, _ in pieces:
        s = samples[name]
        out[name] = errors.get(name) or {"median": round(statistics.median(s), 2), "min": round(min(s), 2),
                                         "max": round(max(s), 2)}
    return out


def main():
    dev = torch.device("cuda")
    dec = attnc.compile("attention decode {\n dtype bf16\n head_dim 128\n heads 32 kv 8\n}\n", "decode.attn")
    q = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 256, 8, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    o = torch.empty_like(q)
    dec(q, k, v)
    kern = dec.kernel(0)
    stream = at._stream(q)
    qg = q.clone().requires_grad_()
    pieces = [
        ("attnc call (eager, no grad)", lambda: dec(q, k, v)),
        ("Kernel.forward_torch (Rust: read q/k/v, allocate O, launch)",
         lambda: kern.forward_torch(q, k, v, stream, False, None)),
        ("Kernel.forward with O given (Rust: read q/k/v/o, launch)",
         lambda: kern.forward(q, k, v, o, None, stream, None)),
        ("q.new_empty(O's shape)", lambda: q.new_empty((1, 1, 32, 128))),
        ("torch.empty_like(q)", lambda: torch.empty_like(q)),
        ("current raw stream", lambda: at._stream(q)),
        ("torch.neg(q, out=o) (a torch op with one launch)", lambda: torch.neg(q, out=o)),
        ("sdpa", lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)),
        ("attnc call, q requires grad (autograd node, O and LSE)", lambda: dec(qg, k, v)),
    ]
    try:
        from flash_attn.cute import flash_attn_func

        pieces.append(("fa4 flash_attn_func", lambda: flash_attn_func(q, k, v)))
    except Exception as e:  # noqa: BLE001
        print(f"fa4 not measured: {type(e).__name__}: {e}"[:300])
    rows = interleaved(pieces)
    for name, r in rows.items():
        cells = f"{r['median']:7.2f}  ({r['min']:.2f}-{r['max']:.2f})" if isinstance(r, dict) else r
        print(f"{name:62s} {cells}")
    print(dec.receipt_text())
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "us_per_call": rows,
           "receipt": dec.receipt()}
    if len(sys.argv) > 1:
        pathlib.Path(sys.argv[1]).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
