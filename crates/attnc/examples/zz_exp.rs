fn main() {
    for f in ["alibi_learned", "t5_bias"] {
        let src = std::fs::read_to_string(format!("dsl-examples/{f}.attn")).unwrap();
        let mut spec = attnc::parse_spec("x", &src).unwrap();
        spec.q_heads = 2;
        spec.kv_heads = 2;
        let rb = |round: bool, shard: Option<(std::ops::Range<usize>, std::ops::Range<usize>, (usize, usize))>| {
            let (inputs, sl) = match &shard {
                None => {
                    let i = attnc_ir::random_inputs(&spec, &[(111, 203)], 7);
                    (i, (111usize, 203usize))
                }
                Some((q, k, g)) => (
                    attnc_ir::random_inputs(&spec, &[*g], 7).shard(&spec, q.clone(), k.clone(), true),
                    (q.len(), k.len()),
                ),
            };
            let dv = spec.head_dim_v as usize;
            let qh = spec.q_heads as usize;
            let mut rng = attnc_ir::reference::Rng::new(3);
            let d_out: Vec<Vec<f64>> = vec![(0..sl.0 * qh * dv).map(|_| rng.normal()).collect()];
            let fwd = attnc_ir::reference_forward(&spec, &inputs).unwrap();
            let o: Vec<Vec<f64>> = fwd
                .iter()
                .map(|x| {
                    x.o.iter()
                        .map(|v| if round { attnc_ir::reference::round_to_dtype(*v, spec.dtype) } else { *v })
                        .collect()
                })
                .collect();
            let g = attnc_ir::reference::reference_backward_with_output(&spec, &inputs, &d_out, &o).unwrap();
            g.daux[0].clone().unwrap()
        };
        for sh in [None, Some((97..208, 150..353, (300usize, 517usize))), Some((297..408, 150..353, (517, 517)))] {
            let a = rb(false, sh.clone());
            let b = rb(true, sh.clone());
            let n = a.iter().map(|x| x * x).sum::<f64>().sqrt();
            let d = a.iter().zip(&b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
            println!("{f} {:?}: |daux| {n:.3e}, rel change from bf16 O {:.3e}", sh.map(|s| (s.0, s.1, s.2)), d / n);
        }
    }
}
