#!/usr/bin/env python3
"""The hopper forward's steady-state steps as ptxas schedules them, read from the SASS
without a GPU: for each stretch between two P·V issues (`HGMMA.64xNx16` with P from
registers), its instruction count, the moves (`MOV`/`IMAD.MOV`/`IMAD`), and how many
`MUFU.EX2` / `MUFU.TANH` sit between the wait for S (`WARPGROUP.DEPBAR.LE gsb0, 0x1`) and
the wait for P·V (`... 0x0`) — the exponentials that run under P·V.

Usage: python3 scripts/dev/sass_steps.py FILE.attn [TUNE]
  TUNE  an ATTNC_HOPPER_TUNE value, e.g. pin_pv_wait=1,split_mask=1
Needs `target/release/attnc` and the venv's ptxas and cuobjdump (`scripts/setup.sh`).
"""
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tool(name):
    hits = glob.glob(os.path.join(ROOT, ".venv/lib/python3*/site-packages/nvidia/cu13/bin", name))
    if not hits:
        sys.exit(f"no {name} in the venv (run scripts/setup.sh)")
    return hits[0]


def sass_of(attn, tune):
    env = dict(os.environ, ATTNC_HOPPER_TUNE=tune or "")
    ptx = subprocess.run(
        [os.path.join(ROOT, "target/release/attnc"), "dump", "--arch", "sm_90a", "--family", "hopper",
         "--pass", "fwd", "--emit", "ptx", attn],
        check=True, capture_output=True, text=True, env=env).stdout
    with tempfile.TemporaryDirectory() as d:
        p, c = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        open(p, "w").write(ptx)
        subprocess.run([tool("ptxas"), "-arch=sm_90a", "-O3", p, "-o", c], check=True)
        return subprocess.run([tool("cuobjdump"), "-sass", c], check=True, capture_output=True, text=True).stdout


def main(attn, tune=""):
    ins = [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", sass_of(attn, tune))]
    pv = [i for i, t in enumerate(ins) if re.search(r"HGMMA\.64x\d+x16\.F32\.\w+ R\d+, R\d+", t)]
    starts = [i for k, i in enumerate(pv) if k == 0 or i - pv[k - 1] > 20]
    print(f"{os.path.basename(attn)} {tune or '(default)'}")
    print("| step | instructions | moves | exp2 / tanh under P.V | exp2 / tanh in all |")
    print("|---:|---:|---:|---|---|")
    for k in range(len(starts) - 1):
        seg = ins[starts[k]:starts[k + 1]]
        ops = collections.Counter((t.split()[1] if t.startswith("@") else t.split()[0]) for t in seg)
        moves = sum(n for op, n in ops.items() if op.startswith("MOV") or op.startswith("IMAD"))
        under, after_s = collections.Counter(), None
        for t in seg:
            if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in t:
                after_s = collections.Counter()
            elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in t and after_s is not None:
                under, after_s = after_s, None
            elif after_s is not None and "MUFU." in t:
                after_s[t.split()[0] if not t.startswith("@") else t.split()[1]] += 1
        print(f"| {k} | {len(seg)} | {moves} | {under['MUFU.EX2']} / {under['MUFU.TANH']} "
              f"| {ops['MUFU.EX2']} / {ops['MUFU.TANH']} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(*sys.argv[1:3])
