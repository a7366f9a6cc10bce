#!/usr/bin/env python3
"""Where ptxas spends its time on one module: times ptxas on a module's PTX as emitted and
with parts of it removed, so the cold-compile cost can be traced to what the PTX holds (the
removed forms are wrong code: for timing only).

Usage: attnc dump --arch sm_90a --pass fwd FILE.attn -o FWD.ptx   (one module)
       scripts/dev/ptxas_cost.py FWD.ptx [--ptxas PATH] [--arch sm_90a] [--runs 3]

Rows: as emitted; without the wgmma.mma_async instructions; without the ss ones (A from
shared memory); without the rs ones (A from registers); with ex2.approx as mov; without
wgmma fence/commit/wait. Each is the median of --runs ptxas runs, ptxas's own
"Compile time" line.
"""

import argparse
import os
import re
import statistics
import subprocess
import tempfile


def drop_lines(text, keep):
    return "\n".join(line for line in text.split("\n") if keep(line))


def is_mma(line):
    return line.strip().startswith("wgmma.mma_async")


def a_from_registers(line):
    # The rs form's A operand is a register vector after the accumulator vector.
    return "{%r" in line.split("},", 1)[1]


VARIANTS = {
    "as emitted": lambda t: t,
    "no wgmma.mma_async": lambda t: drop_lines(t, lambda l: not is_mma(l)),
    "no ss wgmma": lambda t: drop_lines(t, lambda l: not (is_mma(l) and not a_from_registers(l))),
    "no rs wgmma": lambda t: drop_lines(t, lambda l: not (is_mma(l) and a_from_registers(l))),
    "ex2.approx as mov": lambda t: re.sub(r"ex2\.approx(\.ftz)?\.f32", "mov.f32", t),
    "no wgmma fence/commit/wait": lambda t: drop_lines(
        t, lambda l: not re.match(r"\s*wgmma\.(fence|commit_group|wait_group)", l)
    ),
}


def ptxas_ms(ptxas, arch, path, runs):
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [ptxas, f"-arch={arch}", "-v", path, "-o", os.devnull], capture_output=True, text=True
        )
        m = re.search(r"Compile time = ([0-9.]+) ms", out.stdout + out.stderr)
        if not m:
            return None, (out.stderr or out.stdout).strip().splitlines()[-1:]
        times.append(float(m.group(1)))
    return statistics.median(times), None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump", help="one module's PTX (attnc dump --pass fwd or --pass bwd)")
    ap.add_argument("--ptxas", default=os.environ.get("ATTNC_PTXAS", "ptxas"))
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    text = open(args.dump).read()
    mmas = sum(1 for line in text.split("\n") if is_mma(line))
    print(f"{args.dump}: {mmas} wgmma.mma_async, {text.count(chr(10))} lines")
    print("| PTX | ptxas ms |\n|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in VARIANTS.items():
            path = os.path.join(tmp, "k.ptx")
            with open(path, "w") as f:
                f.write(fn(text))
            ms, err = ptxas_ms(args.ptxas, args.arch, path, args.runs)
            print(f"| {name} | {ms:.1f} |" if ms is not None else f"| {name} | failed: {err} |")


if __name__ == "__main__":
    main()
