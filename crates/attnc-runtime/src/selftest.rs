//! selftest
