//! attnc-lower: kernel families and codegen.
