//! attnc-dsl: the `.attn` language (parser, printer, diagnostics).
