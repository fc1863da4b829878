//! hami-model: model platforms and scenarios that drive hami-shm's protocols under loom
//! (`RUSTFLAGS="--cfg loom"`), shuttle (`--cfg shuttle`) and proptest. Tests only.
