#!/usr/bin/env python3
"""The causal backward's tail, modelled: a list scheduler over 132 SMs takes the key-tile
CTAs in launch order (key tile fastest, then head, then batch: the hardware order of the
grid `(key tiles, heads, batch)`), each CTA's time its walk length (query tiles at and
after its key tile under a top-left causal mask) plus a fixed cost. Prints the makespan
over the ideal (total work / SMs) for that order, for LPT sections (heads whose Q, dO and
dQ accumulator fit SECTION_MIB, key tiles reversed within a section) and for a global
LPT order (which gives up L2 locality). Usage: bwd_tail_model.py [SECTION_MIB] [FIXED]."""
import heapq
import sys

SMS = 132


def makespan(jobs):
    free = [0.0] * SMS
    heapq.heapify(free)
    for j in jobs:
        heapq.heappush(free, heapq.heappop(free) + j)
    return max(free)


def main():
    section_mib = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    fixed = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    print(f"{'d':>4} {'seqlen':>6} {'section':>7} {'hardware':>9} {'sections':>9} {'global':>7}")
    for d in (64, 128):
        heads = 2048 // d
        for s in (1024, 2048, 4096, 8192, 16384):
            batch, nt = 32768 // s, s // 128
            hw = [(nt - n) + fixed for _ in range(batch * heads) for n in range(nt)]
            ideal = sum(hw) / SMS
            per_head = s * d * (2 + 2 + 4)  # Q and dO bf16, the dQ accumulator f32
            sec = max(1, min(batch * heads, int(section_mib * 2**20) // per_head))
            secl = [
                (nt - n) + fixed
                for s0 in range(0, batch * heads, sec)
                for n in range(nt)
                for _ in range(s0, min(batch * heads, s0 + sec))
            ]
            print(f"{d:>4} {s:>6} {sec:>7} {makespan(hw) / ideal:>9.3f} {makespan(secl) / ideal:>9.3f} "
                  f"{makespan(sorted(hw, reverse=True)) / ideal:>7.3f}")


if __name__ == "__main__":
    main()
