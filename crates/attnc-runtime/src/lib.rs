//! attnc-runtime.
