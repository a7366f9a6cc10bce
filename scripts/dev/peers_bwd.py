#!/usr/bin/env python3
"""The peers' backward at several head dims, measured by the anchors' own `suite_bwd` (the
anchors' bench.py times the backward at head_dim 128 only; the protocol's backward cells
include head_dim 64). Writes bench.py's JSON format, so `side_by_side.py` reads it.

Usage: python3 scripts/dev/peers_bwd.py BENCH_PY OUT.json [--hdims 64,128]
       [--seqlens 1024,2048,4096,8192,16384] [--backends fa4,cudnn,fa2]
"""
import argparse
import importlib.util
import json

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_py")
    ap.add_argument("out")
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--backends", default="fa4,cudnn,fa2")
    a = ap.parse_args()
    spec = importlib.util.spec_from_file_location("anchors_bench", a.bench_py)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "cuda": torch.version.cuda}
    res = []
    for hd in (int(x) for x in a.hdims.split(",")):
        bench.suite_bwd(res, a.backends.split(","), [int(x) for x in a.seqlens.split(",")], hd=hd)
        json.dump({"meta": meta, "results": res}, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
