#!/usr/bin/env python3
"""Throughput of the special-function instructions on the GPU: one PTX kernel per
instruction (8 independent chains per thread, `ITERS` steps, 16 warps per CTA, 4 CTAs per
SM), timed with CUDA events back to back, with `fma.rn.f32` as the reference. Packed
forms (`.f16x2`, `.bf16x2`) count two values per instruction. The question it answers:
whether a packed `tanh`/`ex2` (which ptxas 13.5 assembles to two `MUFU.*.F16` for
sm_90a) issues at the rate of the f32 one, i.e. whether it halves a score's MUFU time.

Usage: python3 scripts/dev/mufu_probe.py OUT_JSON            (on the GPU machine: cupy)
       python3 scripts/dev/mufu_probe.py --ptx DIR           (write the PTX, no GPU)
"""
import json
import os
import sys

ITERS = 4096
CHAINS = 8
THREADS = 512

# name -> (instruction, register kind, values per instruction)
OPS = {
    "fma.rn.f32": ("fma.rn.f32 {x}, {x}, 0f3F7FF000, 0f3A800000;", "f", 1),
    "ex2.approx.f32": ("ex2.approx.f32 {x}, {x};", "f", 1),
    "ex2.approx.ftz.f32": ("ex2.approx.ftz.f32 {x}, {x};", "f", 1),
    "tanh.approx.f32": ("tanh.approx.f32 {x}, {x};", "f", 1),
    "ex2.approx.f16x2": ("ex2.approx.f16x2 {x}, {x};", "b", 2),
    "ex2.approx.ftz.bf16x2": ("ex2.approx.ftz.bf16x2 {x}, {x};", "b", 2),
    "tanh.approx.f16x2": ("tanh.approx.f16x2 {x}, {x};", "b", 2),
    "tanh.approx.bf16x2": ("tanh.approx.bf16x2 {x}, {x};", "b", 2),
}


def ptx(name):
    op, kind, _ = OPS[name]
    reg = "%f" if kind == "f" else "%h"
    decl = f".reg .f32 %f<{CHAINS + 2}>;" if kind == "f" else f".reg .b32 %h<{CHAINS + 2}>; .reg .f32 %f<2>;"
    lines = [
        ".version 8.0", ".target sm_90a", ".address_size 64", "",
        ".visible .entry probe(.param .u64 out, .param .u32 iters)", "{",
        f"  {decl}", "  .reg .b32 %r<6>; .reg .pred %p; .reg .u64 %rd<4>;",
        "  mov.u32 %r1, %tid.x;", "  cvt.rn.f32.u32 %f0, %r1;", "  mul.f32 %f0, %f0, 0f3A800000;",
    ]
    for c in range(CHAINS):
        if kind == "f":
            lines.append(f"  add.f32 %f{c + 1}, %f0, 0f3C23D70A;")
        else:
            lines.append(f"  cvt.rn.f16x2.f32 %h{c + 1}, %f0, %f0;")
    lines += ["  ld.param.u32 %r2, [iters];", "LOOP:"]
    for c in range(CHAINS):
        lines.append("  " + op.format(x=f"{reg}{c + 1}"))
    lines += ["  sub.u32 %r2, %r2, 1;", "  setp.ne.u32 %p, %r2, 0;", "  @%p bra LOOP;"]
    # Fold the chains into one word per thread so nothing is dead.
    acc = f"{reg}1"
    for c in range(1, CHAINS):
        if kind == "f":
            lines.append(f"  add.f32 %f1, %f1, %f{c + 1};")
        else:
            lines.append(f"  xor.b32 %h1, %h1, %h{c + 1};")
    lines += [
        "  ld.param.u64 %rd1, [out];", "  mov.u32 %r3, %ctaid.x;", "  mov.u32 %r5, %ntid.x;",
        "  mad.lo.u32 %r4, %r3, %r5, %r1;",
        "  mul.wide.u32 %rd2, %r4, 4;", "  add.u64 %rd3, %rd1, %rd2;",
        f"  st.global.{'f32' if kind == 'f' else 'b32'} [%rd3], {acc};", "  ret;", "}",
    ]
    return "\n".join(lines) + "\n"


def main(out):
    import cupy as cp
    import numpy as np
    dev = cp.cuda.Device(0)
    sms = dev.attributes["MultiProcessorCount"]
    ctas = 4 * sms
    res = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "sms": sms, "ctas": ctas,
           "threads": THREADS, "chains": CHAINS, "iters": ITERS, "ops": {}}
    buf = cp.zeros(ctas * THREADS, dtype=cp.uint32)
    for name in OPS:
        # RawModule takes PTX text as a file; the driver JIT assembles it.
        path = os.path.join(os.path.dirname(os.path.abspath(out)), f"probe_{name}.ptx")
        open(path, "w").write(ptx(name))
        fn = cp.RawModule(path=path).get_function("probe")
        args = (np.uint64(buf.data.ptr), np.uint32(ITERS))
        fn((ctas,), (THREADS,), args)
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(5):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(); fn((ctas,), (THREADS,), args); b.record(); b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b))
        ms = sorted(times)[len(times) // 2]
        instr = ctas * THREADS / 32 * CHAINS * ITERS  # PTX warp instructions (a packed one is two MUFU)
        per_values = OPS[name][2]
        res["ops"][name] = {"ms": ms, "warp_instr_per_ns_per_sm": instr / (ms * 1e6) / sms,
                            "values_per_ns_per_sm": instr * 32 * per_values / (ms * 1e6) / sms}
        print(f"{name:24s} {ms:8.3f} ms  {res['ops'][name]['warp_instr_per_ns_per_sm']:.3f} warp instr/ns/SM  "
              f"{res['ops'][name]['values_per_ns_per_sm']:.2f} values/ns/SM")
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--ptx":
        os.makedirs(sys.argv[2], exist_ok=True)
        for name in OPS:
            open(os.path.join(sys.argv[2], name + ".ptx"), "w").write(ptx(name))
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
