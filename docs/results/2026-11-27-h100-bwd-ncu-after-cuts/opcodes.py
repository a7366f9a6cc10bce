"""Executed warp instructions per opcode of attnc's d64 backward (this receipt) beside the
counts of ../2026-11-27-h100-bwd-d64-vs-fa4-ncu/opcodes.md (attnc before the cuts, FA4)."""
import collections
import csv
import lzma
import re

rows = list(csv.reader(lzma.open("sass_t64h32.csv.xz", "rt")))
hdr = rows[1]
ix = {h: i for i, h in enumerate(hdr)}
now = collections.Counter()
for r in rows[2:]:
    op = r[ix["Source"]].split()
    if not op:
        continue
    name = op[1] if op[0].startswith("@") and len(op) > 1 else op[0]
    now[name.split(".")[0]] += int(r[ix["Instructions Executed"]] or 0)
before, fa4 = {}, {}
for line in open("../2026-11-27-h100-bwd-d64-vs-fa4-ncu/opcodes.md"):
    m = re.match(r"\| (\S+) \| ([\d.]+) \| ([\d.]+) \|", line)
    if m:
        before[m.group(1)], fa4[m.group(1)] = float(m.group(2)), float(m.group(3))
total = sum(now.values()) / 1e6
print("| opcode | attnc before (M) | attnc now (M) | FA4 (M) |")
print("|---|---:|---:|---:|")
print(f"| all | {before['all']:.0f} | {total:.0f} | {fa4['all']:.0f} |")
names = sorted(set(before) - {"all"} | {k for k, v in now.items() if v > 5e6}, key=lambda k: -now.get(k, 0))
def old(table, k):
    # The old table lists only the opcodes whose counts differed (the rest were equal).
    return f"{table[k]:.1f}" if k in table else "="


for k in names:
    print(f"| {k} | {old(before, k)} | {now.get(k, 0) / 1e6:.1f} | {old(fa4, k)} |")
print()
print("`=`: not among the old table's rows (those were the largest differences then).")
