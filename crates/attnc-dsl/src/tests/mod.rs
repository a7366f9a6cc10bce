#[test]
fn smoke() {
    let src = "// Gemma 2 style\nattention gemma2 {\n  dtype bf16\n  head_dim 256\n  heads 16 kv 8 pack_gqa\n  param prefix: int\n  aux doc: int[batch, seqlen_k]\n  mask causal(bottom_right) && window(left=4095, right=0) && doc[b, q] == doc[b, k]\n  score softcap(score, 50.0)\n  scale 0.0625\n  sinks\n  kv paged(page_size=16)\n  split auto\n  lse\n  softmax exp2_emulation=0.15 rescale_threshold=8.0\n}\n";
    let s = crate::parse(src).unwrap();
    println!("{s:#?}");
    let p = crate::print(&s);
    println!("{p}");
    assert_eq!(crate::parse(&p).unwrap(), s);
    for bad in ["attention x {\n head_dim 100\n heads 8\n}", "attention x {\n head_dim 128\n heads 8\n mask q < k x\n score foo + 1\n dtype bf16; dtype fp16\n}", "attention x { head_dim 128; heads 8; mask causal || q < k; score score - float(q) }"] {
        println!("{}\n", crate::parse(bad).unwrap_err());
    }
}
