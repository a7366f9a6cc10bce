//! attnc facade.
