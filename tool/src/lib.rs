//! The report behind `shrreg-tool` ([`inspect`]), a library so that the tool's tests check it on
//! in-memory regions.

pub mod inspect;
