//! The canonical text of a spec: `parse(&print(&spec)) == Ok(spec)` for every valid
//! spec. Settings come in a fixed order; those at their default are left out (except
//! `dtype`, which is always written).

use attnc_ir::{Align, Expr, ExprKind, KvLayout, Scale, Spec, SplitKv, UnOp};
use std::fmt::Write;

/// Prints a float so that parsing the text gives the same f64 back, always with a `.`
/// or an exponent so it reads back as a float.
pub(crate) fn float(v: f64) -> String {
    // Debug is the shortest round-tripping form and always has `.` or `e` (e.g. `1.0`,
    // `0.0625`, `1e-7`, `1e16`).
    format!("{v:?}")
}

pub fn print(spec: &Spec) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str("  ");
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("dtype {}", spec.dtype.name()));
    if spec.head_dim_qk == spec.head_dim_v {
        line(format!("head_dim {}", spec.head_dim_qk));
    } else {
        line(format!("head_dim {}/{}", spec.head_dim_qk, spec.head_dim_v));
    }
    let mut heads = format!("heads {}", spec.q_heads);
    if spec.kv_heads != spec.q_heads || spec.pack_gqa {
        let _ = write!(heads, " kv {}", spec.kv_heads);
    }
    if spec.pack_gqa {
        heads.push_str(" pack_gqa");
    }
    line(heads);
    for p in &spec.params {
        line(format!("param {}: {}", p.name, p.ty));
    }
    for a in &spec.aux {
        let dims: Vec<String> = a.dims.iter().map(|d| d.name()).collect();
        let learnable = if a.learnable { " learnable" } else { "" };
        line(format!("aux {}: {}[{}]{learnable}", a.name, a.elem.name(), dims.join(", ")));
    }
    if !spec.mask.is_none() {
        line(format!("mask {}", mask(spec)));
    }
    if let Some(s) = &spec.score_mod {
        line(format!("score {}", expr(s)));
    }
    if let Scale::Value(v) = spec.scale {
        line(format!("scale {}", float(v)));
    }
    if spec.sinks {
        line("sinks".into());
    }
    match spec.kv_layout {
        KvLayout::Contiguous => {}
        KvLayout::Varlen => line("kv varlen".into()),
        KvLayout::Paged { page_size } => line(format!("kv paged(page_size={page_size})")),
    }
    match spec.split_kv {
        SplitKv::None => {}
        SplitKv::Auto => line("split auto".into()),
        SplitKv::Fixed(n) => line(format!("split {n}")),
    }
    if spec.lse {
        line("lse".into());
    }
    if spec.shards {
        line("shards".into());
    }
    let o = spec.softmax;
    if o.exp2_emulation != 0.0 || o.rescale_threshold != 0.0 {
        let mut s = "softmax".to_string();
        if o.exp2_emulation != 0.0 {
            let _ = write!(s, " exp2_emulation={}", float(o.exp2_emulation));
        }
        if o.rescale_threshold != 0.0 {
            let _ = write!(s, " rescale_threshold={}", float(o.rescale_threshold));
        }
        line(s);
    }
    format!("attention {} {{\n{out}}}\n", spec.name)
}

fn mask(spec: &Spec) -> String {
    let m = &spec.mask;
    let mut parts = Vec::new();
    if let Some(a) = m.causal {
        // A param named `causal` takes the bare word; the builtin then needs its argument.
        let param_named_causal = spec.params.iter().any(|p| p.name == "causal");
        parts.push(match a {
            Align::TopLeft if !param_named_causal => "causal".to_string(),
            a => format!("causal({})", a.name()),
        });
    }
    if let Some(w) = m.window {
        let mut args = Vec::new();
        if let Some(l) = w.left {
            args.push(format!("left={l}"));
        }
        if let Some(r) = w.right {
            args.push(format!("right={r}"));
        }
        if w.align != m.causal.unwrap_or_default() {
            args.push(format!("align={}", w.align.name()));
        }
        parts.push(format!("window({})", args.join(", ")));
    }
    if let Some(p) = &m.predicate {
        if parts.is_empty() {
            parts.push(expr(p));
        } else {
            // `c && w && P`: P's own `&&` chain continues the left-associative chain and
            // the parser takes `c` and `w` out again leaving P's exact shape; only
            // operators weaker than `&&` need parentheses.
            let mut s = String::new();
            operand(p, attnc_ir::BinOp::And.precedence(), &mut s);
            parts.push(s);
        }
    }
    parts.join(" && ")
}

/// An expression in canonical form.
pub fn expr(e: &Expr) -> String {
    let mut s = String::new();
    write_expr(e, &mut s);
    s
}

/// Binding strength of a node's top operator: binary ops by precedence, unary above
/// them, atoms on top.
fn strength(e: &Expr) -> u8 {
    match &e.kind {
        ExprKind::Binary(op, _, _) => op.precedence(),
        ExprKind::Unary(..) => 7,
        _ => 8,
    }
}

/// Writes `e`, parenthesized if it binds weaker than `min`.
fn operand(e: &Expr, min: u8, out: &mut String) {
    if strength(e) < min {
        out.push('(');
        write_expr(e, out);
        out.push(')');
    } else {
        write_expr(e, out);
    }
}

fn write_list(args: &[Expr], out: &mut String) {
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_expr(a, out);
    }
}

fn write_expr(e: &Expr, out: &mut String) {
    match &e.kind {
        ExprKind::Int(v) => {
            let _ = write!(out, "{v}");
        }
        ExprKind::Float(v) => out.push_str(&float(*v)),
        ExprKind::Bool(v) => out.push_str(if *v { "true" } else { "false" }),
        ExprKind::Var(v) => out.push_str(v.name()),
        ExprKind::Param(p) => out.push_str(p),
        ExprKind::Aux { name, index } => {
            out.push_str(name);
            out.push('[');
            write_list(index, out);
            out.push(']');
        }
        ExprKind::Unary(op, a) => {
            out.push_str(match op {
                UnOp::Neg => "-",
                UnOp::Not => "!",
            });
            // `-5` would read back as the literal -5, so negating a literal is `-(5)`.
            let literal = matches!(a.kind, ExprKind::Int(_) | ExprKind::Float(_));
            if literal && *op == UnOp::Neg {
                out.push('(');
                write_expr(a, out);
                out.push(')');
            } else {
                operand(a, 7, out);
            }
        }
        ExprKind::Binary(op, a, b) => {
            let p = op.precedence();
            operand(a, p, out);
            let _ = write!(out, " {} ", op.symbol());
            operand(b, p + 1, out);
        }
        ExprKind::Call(f, args) => {
            out.push_str(f.name());
            out.push('(');
            write_list(args, out);
            out.push(')');
        }
    }
}
