#!/bin/bash
# attnc.compare on every example with contiguous or varlen KV (check-only, eager Flex),
# then timed sweeps of a few variants; all rows into $OUT/compare.jsonl.
for f in dsl-examples/*.attn; do
  n=$(basename $f .attn)
  case $n in gqa_decode_paged|sinks) echo "$n: skipped (no FlexAttention form: paged KV / sinks)"; continue;; esac
  extra=""; [ $n = prefix_lm ] && extra="--param prefix=300"
  python3 -m attnc.compare $f --seqlen 1000,2049 --batch 2 --check-only $extra --json /tmp/c.json 2>&1 | grep -v "^DEBUG\|Warning\|warn" | tail -3
  cat /tmp/c.json >> $OUT/compare.jsonl; echo >> $OUT/compare.jsonl
done
for n in document_mask sliding_window grok_softcap causal; do
  python3 -m attnc.compare dsl-examples/$n.attn --seqlen 1024,2048,4096,8192 --batch 4 --json /tmp/c.json --plot $OUT/$n.svg 2>&1 | grep -v "^DEBUG\|Warning\|warn" | tail -5
  cat /tmp/c.json >> $OUT/compare_timed.jsonl; echo >> $OUT/compare_timed.jsonl
done
