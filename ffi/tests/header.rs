//! The checked-in C header is what cbindgen generates now. `UPDATE_HEADER=1` rewrites it.

use std::path::Path;

use hami_shm::layout;

/// cbindgen emits constants of the root crate only, so hami-shm's are written here, from the
/// values themselves.
fn constants() -> String {
    let defines: [(&str, String); 15] = [
        ("MAGIC", layout::MAGIC.to_string()),
        ("INIT_IN_PROGRESS", layout::INIT_IN_PROGRESS.to_string()),
        ("MAJOR_VERSION", layout::MAJOR_VERSION.to_string()),
        ("MINOR_VERSION", layout::MINOR_VERSION.to_string()),
        ("ABI_SLOTS", layout::ABI_SLOTS.to_string()),
        ("ABI_DEVS", layout::ABI_DEVS.to_string()),
        ("UUID_LEN", layout::UUID_LEN.to_string()),
        ("EXT_MAGIC", format!("{:#x}ULL", layout::EXT_MAGIC)),
        ("EXT_VERSION", layout::EXT_VERSION.to_string()),
        ("EXT_OFFSET", layout::EXT_OFFSET.to_string()),
        ("EXT_END", layout::EXT_END.to_string()),
        ("EXT_RESERVED_WORDS", layout::EXT_RESERVED_WORDS.to_string()),
        ("STATUS_EXITED", layout::STATUS_EXITED.to_string()),
        ("STATUS_RUNNING", layout::STATUS_RUNNING.to_string()),
        ("STATUS_SUSPENDED", layout::STATUS_SUSPENDED.to_string()),
    ];
    let mut text = String::from("\n/* Constants of hami-shm's layout module. */\n");
    for (name, value) in defines {
        text += &format!("#define {name} {value}\n");
    }
    text
}

#[test]
fn header_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let generated = cbindgen::Builder::new()
        .with_crate(root.join("ffi"))
        .with_config(config)
        .with_after_include(constants())
        .generate()
        .expect("cbindgen failed");
    let mut fresh = Vec::new();
    generated.write(&mut fresh);
    let fresh = String::from_utf8(fresh).unwrap();
    let path = root.join("ffi/include/hami_shm.h");
    if std::env::var_os("UPDATE_HEADER").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &fresh).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "ffi/include/hami_shm.h is stale: run `UPDATE_HEADER=1 cargo test -p hami-vgpu --test header` and commit it"
    );
}
