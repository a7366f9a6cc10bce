#!/usr/bin/env python3
"""The module layering of attnc-lower and attnc-runtime, checked from their sources.

Every `crate::...` / `super::...` path outside comments and test modules is an import
edge between modules. The check fails on:
  - an import cycle between modules (at every nesting depth up to 3);
  - an arrow that points up in attnc-lower's layers:
        arch, module, error  <  llvm  <  variant  <  families::common  <  each family  <  compile
    (ptxas, the offline assembler driver, sits beside llvm), or between two families.

Usage: python3 scripts/layers.py   (from anywhere; exits 1 with the offending edges)
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# attnc-lower: which top-level modules each layer may import (besides itself).
LOWER_ALLOWED = {
    "arch": set(),
    "module": {"arch"},
    "error": {"arch", "module"},
    "llvm": {"arch", "module", "error"},
    "variant": {"arch", "module", "error", "llvm"},
    "families": {"arch", "module", "error", "llvm", "variant", "ptxas"},
    # compile_without_spills assembles to choose a configuration.
    "compile": {"arch", "module", "error", "families", "ptxas"},
    "ptxas": {"arch"},
}
FAMILIES = {"portable", "hopper", "blackwell"}


def module_path(src_root, path):
    rel = os.path.relpath(path, src_root)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def edges_of(src_root):
    """(importer module path, imported module path) for every import in the crate."""
    out = []
    for d, _, files in os.walk(src_root):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(d, f)
            mp = module_path(src_root, path)
            src = open(path, encoding="utf-8").read().split("#[cfg(test)]")[0]
            src = "\n".join(line for line in src.split("\n") if not line.strip().startswith("//"))
            for m in re.finditer(r"\b(crate|super)((?:::\w+)+)", src):
                rest = m.group(2).split("::")[1:]
                if m.group(1) == "crate":
                    target = rest
                else:
                    # `super` of a/b.rs and of a/b/mod.rs is a.
                    target = mp[:-1] + rest
                    while target and target[0] == "super":
                        target = target[1:]
                if target:
                    out.append((tuple(mp), tuple(target)))
    return out


def cycles(edges, depth):
    graph = {}
    for a, b in edges:
        a, b = a[:depth], b[:depth]
        if a and b and a[: len(b)] != b and b[: len(a)] != a:
            graph.setdefault(a, set()).add(b)
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    lines = []
    for comp in found:
        names = ["::".join(c) for c in comp]
        inner = sorted(f"{'::'.join(a)} -> {'::'.join(b)}" for a in comp for b in graph.get(a, ()) if b in comp)
        lines.append(f"cycle at depth {depth} between {names}: " + "; ".join(inner))
    return lines


def lower_layer_violations(edges):
    bad = []
    for a, b in edges:
        top_a, top_b = a[0] if a else "", b[0] if b else ""
        if top_a == top_b:
            if top_a == "families" and len(a) > 1 and len(b) > 1 and a[1] != b[1]:
                if a[1] == "common" and b[1] in FAMILIES:
                    bad.append(f"families::common imports a family: {'::'.join(a)} -> {'::'.join(b)}")
                elif a[1] in FAMILIES and b[1] in FAMILIES:
                    bad.append(f"a family imports another: {'::'.join(a)} -> {'::'.join(b)}")
            continue
        allowed = LOWER_ALLOWED.get(top_a)
        if allowed is not None and top_b in LOWER_ALLOWED and top_b not in allowed:
            bad.append(f"upward import: {'::'.join(a)} -> {'::'.join(b)}")
    return sorted(set(bad))


def main():
    problems = []
    for crate in ("attnc-lower", "attnc-runtime"):
        src = os.path.join(ROOT, "crates", crate, "src")
        edges = edges_of(src)
        for depth in (1, 2, 3):
            problems += [f"{crate}: {p}" for p in cycles(edges, depth)]
        if crate == "attnc-lower":
            problems += [f"{crate}: {p}" for p in lower_layer_violations(edges)]
    if problems:
        print("module layering broken:")
        for p in problems:
            print("  " + p)
        sys.exit(1)
    print("[layers] attnc-lower and attnc-runtime: no import cycles, attnc-lower's arrows point down")


if __name__ == "__main__":
    main()
