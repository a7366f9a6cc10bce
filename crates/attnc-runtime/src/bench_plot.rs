//! `attnc bench --plot` (the CLI): the bench report (and the peers' JSON, when given) as an SVG of
//! grouped bars, one panel per suite, head dim and mask — the way FlashAttention's papers
//! plot speed: sequence length on x, one bar per implementation, the value on each bar.
//! Plain SVG text, no plotting dependency.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write;

/// One panel: a title, the unit, x groups and, per series, a value per group.
struct Panel {
    title: String,
    unit: &'static str,
    groups: Vec<String>,
    series: Vec<(String, Vec<Option<f64>>)>,
}

const COLORS: [&str; 6] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

fn f(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}
fn u(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}
fn b(v: &Value, key: &str) -> Option<bool> {
    v.get(key).and_then(Value::as_bool)
}

fn seqlen_label(s: u64) -> String {
    if s >= 1024 && s % 1024 == 0 {
        format!("{}k", s / 1024)
    } else {
        s.to_string()
    }
}

/// Rows of one throughput suite keyed by (head dim, causal) → series → seqlen → value.
type Table = BTreeMap<(u64, bool), BTreeMap<String, BTreeMap<u64, f64>>>;

fn add(t: &mut Table, hdim: u64, causal: bool, series: &str, seqlen: u64, value: f64) {
    t.entry((hdim, causal)).or_default().entry(series.to_string()).or_default().insert(seqlen, value);
}

/// The panels of a report: forward and backward TFLOP/s per (head dim, mask), decode TB/s.
fn panels(report: &Value, peers: Option<&Value>) -> Vec<Panel> {
    let mut fwd = Table::new();
    let mut bwd = Table::new();
    let mut decode: BTreeMap<String, BTreeMap<(u64, u64), f64>> = BTreeMap::new();
    let empty = Vec::new();
    let rows = |key: &str| report.get(key).and_then(Value::as_array).unwrap_or(&empty).clone();
    for r in rows("prefill") {
        if let (Some(d), Some(c), Some(s), Some(t)) =
            (r["head_dim"].get(0).and_then(Value::as_u64), b(&r, "causal"), u(&r, "seqlen"), f(&r, "tflops"))
        {
            add(&mut fwd, d, c, "attnc", s, t);
        }
    }
    for r in rows("backward") {
        if b(&r, "deterministic") == Some(true) {
            continue;
        }
        if let (Some(d), Some(c), Some(s), Some(t)) =
            (r["head_dim"].get(0).and_then(Value::as_u64), b(&r, "causal"), u(&r, "seqlen"), f(&r, "tflops"))
        {
            add(&mut bwd, d, c, "attnc", s, t);
        }
    }
    for r in rows("decode") {
        if u(&r, "page_size") == Some(0) {
            if let (Some(bt), Some(s), Some(t)) = (u(&r, "batch"), u(&r, "seqlen_k"), f(&r, "tb_s")) {
                decode.entry("attnc".into()).or_default().insert((bt, s), t);
            }
        }
    }
    let peer_rows = peers.and_then(|p| p.get("results")).and_then(Value::as_array).cloned().unwrap_or_default();
    for r in peer_rows {
        if r.get("error").is_some() {
            continue;
        }
        let Some(backend) = r.get("backend").and_then(Value::as_str) else { continue };
        let name = peer_name(backend);
        match r.get("suite").and_then(Value::as_str) {
            Some(suite @ ("fwd" | "bwd")) => {
                if let (Some(d), Some(c), Some(s), Some(t)) =
                    (u(&r, "hdim"), b(&r, "causal"), u(&r, "seqlen"), f(&r, "tflops"))
                {
                    add(if suite == "fwd" { &mut fwd } else { &mut bwd }, d, c, &name, s, t);
                }
            }
            Some("decode") if !backend.contains("paged") && !backend.contains("auto") => {
                if let (Some(bt), Some(s), Some(t)) = (u(&r, "batch"), u(&r, "seqlen_k"), f(&r, "tbps")) {
                    decode.entry(name).or_default().insert((bt, s), t);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (table, what) in [(&fwd, "prefill forward"), (&bwd, "backward")] {
        for (&(d, causal), series) in table {
            let mut lens: Vec<u64> = series.values().flat_map(|m| m.keys().copied()).collect();
            lens.sort_unstable();
            lens.dedup();
            out.push(Panel {
                title: format!("{what}, head dim {d}, {}", if causal { "causal" } else { "non-causal" }),
                unit: "TFLOP/s",
                groups: lens.iter().map(|&s| seqlen_label(s)).collect(),
                series: ordered(series).map(|(n, m)| (n, lens.iter().map(|s| m.get(s).copied()).collect())).collect(),
            });
        }
    }
    if !decode.is_empty() {
        let mut keys: Vec<(u64, u64)> = decode.values().flat_map(|m| m.keys().copied()).collect();
        keys.sort_unstable();
        keys.dedup();
        out.push(Panel {
            title: "decode (1 query token)".into(),
            unit: "TB/s",
            groups: keys.iter().map(|&(bt, s)| format!("b{bt} × {}", seqlen_label(s))).collect(),
            series: ordered(&decode).map(|(n, m)| (n, keys.iter().map(|k| m.get(k).copied()).collect())).collect(),
        });
    }
    out
}

/// attnc first, then FA4, cuDNN, FA2, then any other series by name.
fn ordered<V: Clone>(m: &BTreeMap<String, V>) -> impl Iterator<Item = (String, V)> + '_ {
    let rank = |k: &str| ["attnc", "FA4", "cuDNN", "FA2"].iter().position(|&n| n == k).unwrap_or(4);
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort_by_key(|k| (rank(k), k.as_str()));
    keys.into_iter().map(move |k| (k.clone(), m[k].clone()))
}

fn peer_name(backend: &str) -> String {
    match backend {
        "fa4" | "fa4 splits=1" => "FA4".into(),
        "cudnn" => "cuDNN".into(),
        "fa2" => "FA2".into(),
        other => other.to_string(),
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The SVG of a bench report (`attnc bench --json` output) and optionally the peers' JSON.
pub fn bench_svg(report: &Value, peers: Option<&Value>) -> String {
    let panels = panels(report, peers);
    let (pw, ph, cols) = (560.0, 320.0, 2usize);
    let rows = panels.len().div_ceil(cols).max(1);
    let device = report.pointer("/device/name").and_then(Value::as_str).unwrap_or("unknown device");
    let (w, h) = (pw * cols as f64, ph * rows as f64 + 40.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="10" y="24" font-size="16">attnc bench — {}</text>"#, escape(device));
    for (i, p) in panels.iter().enumerate() {
        let (x0, y0) = ((i % cols) as f64 * pw, 40.0 + (i / cols) as f64 * ph);
        panel_svg(&mut s, p, x0, y0, pw, ph);
    }
    s.push_str("</svg>\n");
    s
}

fn panel_svg(s: &mut String, p: &Panel, x0: f64, y0: f64, pw: f64, ph: f64) {
    let (left, right, top, bottom) = (x0 + 50.0, x0 + pw - 10.0, y0 + 30.0, y0 + ph - 50.0);
    let max = p.series.iter().flat_map(|(_, v)| v.iter().flatten()).fold(0.0f64, |a, &b| a.max(b));
    let ymax = if max > 0.0 { nice_ceiling(max) } else { 1.0 };
    let y = |v: f64| bottom - (bottom - top) * v / ymax;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="13" font-weight="bold">{}</text>"#,
        x0 + 50.0,
        y0 + 18.0,
        escape(&p.title)
    );
    let _ = writeln!(s, r#"<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="black"/>"#);
    let _ = writeln!(s, r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="black"/>"#);
    for k in 0..=4 {
        let v = ymax * k as f64 / 4.0;
        let yy = y(v);
        let _ = writeln!(s, r##"<line x1="{left}" y1="{yy}" x2="{right}" y2="{yy}" stroke="#ddd"/>"##);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="10" text-anchor="end">{}</text>"#,
            left - 4.0,
            yy + 3.0,
            fmt_value(v)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="10" transform="rotate(-90 {} {})" text-anchor="middle">{}</text>"#,
        x0 + 12.0,
        (top + bottom) / 2.0,
        x0 + 12.0,
        (top + bottom) / 2.0,
        p.unit
    );
    let n_groups = p.groups.len().max(1) as f64;
    let gw = (right - left) / n_groups;
    let n_series = p.series.len().max(1) as f64;
    let bw = gw * 0.8 / n_series;
    for (g, label) in p.groups.iter().enumerate() {
        let gx = left + gw * g as f64 + gw * 0.1;
        for (k, (_, values)) in p.series.iter().enumerate() {
            let Some(v) = values.get(g).copied().flatten() else { continue };
            let (bx, by) = (gx + bw * k as f64, y(v));
            let _ = writeln!(
                s,
                r#"<rect x="{bx:.1}" y="{by:.1}" width="{:.1}" height="{:.1}" fill="{}"/>"#,
                bw * 0.92,
                bottom - by,
                COLORS[k % COLORS.len()]
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="8" text-anchor="middle">{}</text>"#,
                bx + bw * 0.46,
                by - 2.0,
                fmt_value(v)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" font-size="10" text-anchor="middle">{}</text>"#,
            left + gw * (g as f64 + 0.5),
            bottom + 14.0,
            escape(label)
        );
    }
    for (k, (name, _)) in p.series.iter().enumerate() {
        let lx = left + 90.0 * k as f64;
        let ly = bottom + 32.0;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="10" height="10" fill="{}"/>"#,
            ly - 9.0,
            COLORS[k % COLORS.len()]
        );
        let _ = writeln!(s, r#"<text x="{}" y="{ly}" font-size="11">{}</text>"#, lx + 14.0, escape(name));
    }
}

fn fmt_value(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A round axis maximum (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten), at least `v`.
fn nice_ceiling(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0].iter().map(|m| m * p).find(|&c| c >= v).unwrap_or(10.0 * p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Value {
        serde_json::json!({
            "device": {"name": "NVIDIA H100 80GB HBM3"},
            "prefill": [
                {"head_dim": [128, 128], "causal": false, "seqlen": 1024, "tflops": 505.6},
                {"head_dim": [128, 128], "causal": false, "seqlen": 2048, "tflops": 594.6},
                {"head_dim": [128, 128], "causal": true, "seqlen": 1024, "tflops": 349.7}
            ],
            "backward": [
                {"head_dim": [128, 128], "causal": false, "deterministic": false, "seqlen": 1024, "tflops": 343.7},
                {"head_dim": [128, 128], "causal": false, "deterministic": true, "seqlen": 1024, "tflops": 224.0}
            ],
            "decode": [
                {"batch": 1, "seqlen_k": 32768, "page_size": 0, "tb_s": 1.71},
                {"batch": 1, "seqlen_k": 32768, "page_size": 16, "tb_s": 1.2}
            ]
        })
    }

    #[test]
    fn panels_per_suite_head_dim_and_mask_with_the_peers_beside_attnc() {
        let peers = serde_json::json!({"results": [
            {"suite": "fwd", "backend": "fa4", "hdim": 128, "causal": false, "seqlen": 1024, "tflops": 458.0},
            {"suite": "fwd", "backend": "cudnn", "hdim": 128, "causal": false, "seqlen": 2048, "tflops": 570.9},
            {"suite": "bwd", "backend": "fa4", "hdim": 128, "causal": false, "seqlen": 1024, "tflops": 365.3},
            {"suite": "decode", "backend": "cudnn", "batch": 1, "seqlen_k": 32768, "tbps": 1.47},
            {"suite": "decode", "backend": "fa4 splits=auto", "batch": 1, "seqlen_k": 32768, "error": "no"}
        ]});
        let p = panels(&report(), Some(&peers));
        let titles: Vec<&str> = p.iter().map(|p| p.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "prefill forward, head dim 128, non-causal",
                "prefill forward, head dim 128, causal",
                "backward, head dim 128, non-causal",
                "decode (1 query token)"
            ]
        );
        let fwd = &p[0];
        assert_eq!(fwd.groups, ["1k", "2k"]);
        let names: Vec<&str> = fwd.series.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(names, ["attnc", "FA4", "cuDNN"]);
        assert_eq!(fwd.series[1].1, [Some(458.0), None]);
        // The deterministic backward and paged decode rows are not plotted.
        assert_eq!(p[2].series[0].1, [Some(343.7)]);
        assert_eq!(p[3].series, [("attnc".to_string(), vec![Some(1.71)]), ("cuDNN".to_string(), vec![Some(1.47)])]);
        let svg = bench_svg(&report(), Some(&peers));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // The background, 4 + 1 + 2 + 2 bars, and 3 + 1 + 2 + 2 legend swatches.
        assert_eq!(svg.matches("<rect").count(), 1 + 9 + 8, "{svg}");
        assert!(svg.contains(">506<") && svg.contains(">1.71<"));
    }

    #[test]
    fn ceilings_are_round() {
        assert_eq!(nice_ceiling(594.6), 600.0);
        assert_eq!(nice_ceiling(665.0), 800.0);
        assert_eq!(nice_ceiling(170.0), 200.0);
        assert_eq!(nice_ceiling(1.71), 2.0);
    }
}
