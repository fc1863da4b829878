//! Table tests of `Config::from_lookup`, the override file, and a randomised check of the
//! per-device precedence through `from_lookup` itself.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use hami_linux::config::*;
use hami_shm::envparse::{Expected, Problem};

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

fn cfg(vars: &[(&str, &str)]) -> (Config, Vec<ConfigError>) {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| map.get(k).cloned())
}

fn lines(errs: &[ConfigError]) -> Vec<String> {
    errs.iter().map(|e| e.to_string()).collect()
}

#[test]
fn empty_environment_is_the_default() {
    let (c, errs) = cfg(&[]);
    assert!(errs.is_empty());
    assert_eq!(c, Config::default());
    assert_eq!(c.mem_limit, [None; 16]);
    assert!(!c.mem_limit_malformed);
    assert_eq!(c.sm_limit, [100; 16]);
    assert!(c.per_device_vars.is_empty());
    assert_eq!(c.cache_path, PathBuf::from("/tmp/cudevshr.cache"));
    assert_eq!(c.priority, 1);
    assert_eq!(c.util_policy, UtilPolicy::Default);
    assert_eq!(c.visible_devices, None);
}

#[test]
fn memory_limits_table() {
    // (vars, expected limits for devices 0..3, mem_limit_malformed, number of diagnostics)
    type Row<'a> = (&'a [(&'a str, &'a str)], [Option<u64>; 3], bool, usize);
    let rows: &[Row] = &[
        (
            &[("CUDA_DEVICE_MEMORY_LIMIT", "4g")],
            [Some(4 * G); 3],
            false,
            0,
        ),
        (
            &[("CUDA_DEVICE_MEMORY_LIMIT", "1073741824")],
            [Some(G); 3],
            false,
            0,
        ),
        (
            &[("CUDA_DEVICE_MEMORY_LIMIT", "0x10m")],
            [Some(16 * M); 3],
            false,
            0,
        ),
        (
            &[("CUDA_DEVICE_MEMORY_LIMIT", "010m")],
            [Some(8 * M); 3],
            false,
            0,
        ),
        (
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "2048m"),
            ],
            [Some(4 * G), Some(2 * G), Some(4 * G)],
            false,
            0,
        ),
        (
            &[("CUDA_DEVICE_MEMORY_LIMIT_2", "1g")],
            [None, None, Some(G)],
            false,
            0,
        ),
        // 0 means unlimited, with a warning.
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "0")], [None; 3], false, 1),
        (
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "0"),
            ],
            [None, Some(4 * G), Some(4 * G)],
            false,
            1,
        ),
        // Malformed: fails closed, with no fallback to the other variable.
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "1gbx")], [None; 3], true, 1),
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "-1")], [None; 3], true, 1),
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "")], [None; 3], true, 1),
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "lots")], [None; 3], true, 1),
        (&[("CUDA_DEVICE_MEMORY_LIMIT", "1.5g")], [None; 3], true, 1),
        (
            &[("CUDA_DEVICE_MEMORY_LIMIT", "18446744073709551616")],
            [None; 3],
            true,
            1,
        ),
        (
            &[("CUDA_DEVICE_MEMORY_LIMIT", "17179869184g")],
            [None; 3],
            true,
            1,
        ),
        (
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "1.5g"),
            ],
            [Some(4 * G), None, Some(4 * G)],
            true,
            1,
        ),
        (
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "4gibx"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "2g"),
            ],
            [None, Some(2 * G), None],
            true,
            1,
        ),
        (&[("CUDA_DEVICE_MEMORY_LIMIT_2", "0x")], [None; 3], true, 1),
    ];
    for (vars, want, malformed, n_errs) in rows {
        let (c, errs) = cfg(vars);
        assert_eq!(&c.mem_limit[..3], want, "{vars:?}");
        assert_eq!(c.mem_limit_malformed, *malformed, "{vars:?}");
        if !vars.iter().any(|(k, _)| k.ends_with("_0")) {
            // Device 15 has no per-device variable in any row: it gets what device 0 gets.
            assert_eq!(c.mem_limit[15], want[0], "{vars:?}");
        }
        assert_eq!(errs.len(), *n_errs, "{vars:?}: {:?}", lines(&errs));
    }
}

/// The spellings people write all parse, 1024-based, and silently.
#[test]
fn memory_limit_spellings() {
    for (v, want) in [
        ("1gb", G),
        ("1GB", G),
        ("1GiB", G),
        ("1Gi", G),
        ("1G", G),
        ("1g", G),
        ("1024MiB", G),
        ("1024m", G),
        ("1024MB", G),
        ("512Mi", 512 * M),
        ("1tb", 1 << 40),
        ("1k", 1 << 10),
        ("1kb", 1 << 10),
        ("1KiB", 1 << 10),
        ("1073741824", G),
        ("0x40000000", G),
        ("010m", 8 * M),
    ] {
        for var in ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0"] {
            let (c, errs) = cfg(&[(var, v)]);
            assert_eq!(c.mem_limit[0], Some(want), "{var}={v}");
            assert!(!c.mem_limit_malformed, "{var}={v}");
            assert!(errs.is_empty(), "{var}={v}: {:?}", lines(&errs));
        }
    }
}

/// A malformed global limit that every device overrides decides nothing: said, not fatal.
#[test]
fn malformed_global_overridden_everywhere_is_not_fatal() {
    let names: Vec<String> = (0..16)
        .map(|i| format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"))
        .collect();
    let mut vars: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "2g")).collect();
    vars.push(("CUDA_DEVICE_MEMORY_LIMIT", "1gbx"));
    let (c, errs) = cfg(&vars);
    assert!(!c.mem_limit_malformed);
    assert_eq!(c.mem_limit, [Some(2 * G); 16]);
    assert_eq!(
        lines(&errs),
        ["CUDA_DEVICE_MEMORY_LIMIT=\"1gbx\" is not a size: unknown suffix \"gbx\"; write a whole \
          number of bytes, or one with a unit: 4g, 4GiB, 4096m, 512Ki (units k, m, g, t; \
          1024-based); every device has its own limit variable, so it applies to none"]
    );
}

#[test]
fn malformed_limit_message_is_explicit() {
    const NO_MEMORY: &str =
        "; this process gets no GPU memory (every allocation fails) until it is fixed";
    let (_, errs) = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "1gbx")]);
    assert_eq!(
        lines(&errs),
        [format!(
            "CUDA_DEVICE_MEMORY_LIMIT=\"1gbx\" is not a size: unknown suffix \"gbx\"; write a \
             whole number of bytes, or one with a unit: 4g, 4GiB, 4096m, 512Ki (units k, m, g, \
             t; 1024-based){NO_MEMORY}"
        )]
    );
    assert_eq!(errs[0].severity(), Severity::Error);
    assert_eq!(
        errs[0].kind,
        ConfigErrorKind::Malformed {
            expected: Expected::Size,
            problem: Problem::Trailing { at: 1, end: 4 }
        }
    );

    let (_, errs) = cfg(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_3", "4 g"),
    ]);
    assert_eq!(
        lines(&errs),
        [format!(
            "CUDA_DEVICE_MEMORY_LIMIT_3=\"4 g\" is not a size: a space separates the number \
             from its unit; write 4g{NO_MEMORY}"
        )]
    );
    // Every bad value: one line, naming the variable and the value, saying what happens, and
    // never offering "no limit" as what a malformed value gets.
    for v in [
        "-1",
        "",
        "lots",
        "1.5g",
        "99999999999999999999",
        "08",
        "1gbx",
    ] {
        let (_, errs) = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT_3", v)]);
        assert_eq!(errs.len(), 1, "{v:?}");
        let line = errs[0].to_string();
        assert!(
            line.starts_with(&format!("CUDA_DEVICE_MEMORY_LIMIT_3={v:?} is not a size: ")),
            "{line}"
        );
        assert!(line.ends_with(NO_MEMORY), "{line}");
        assert!(!line.contains("no limit"), "{line}");
        assert!(!line.contains('\n'));
    }
    let (_, errs) = cfg(&[("CUDA_DEVICE_MEMORY_LIMIT", "0")]);
    assert_eq!(errs[0].severity(), Severity::Warning);
    assert_eq!(errs[0].kind, ConfigErrorKind::ZeroMeansUnlimited);
}

/// Per-device limit variables whose suffix is no device index: one line each, ignored.
#[test]
fn per_device_suffix_out_of_range_or_not_a_number() {
    let vars = |pairs: &[(&str, &str)]| {
        Config::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    };
    let (c, errs) = vars(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_99", "1g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_x", "1g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_16", "1g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_01", "1g"),
        ("CUDA_DEVICE_MEMORY_LIMIT_", "1g"),
        ("CUDA_DEVICE_SM_LIMIT_20", "30"),
        ("CUDA_DEVICE_MEMORY_LIMIT_15", "2g"),
        ("CUDA_DEVICE_MEMORY_LIMITS", "1g"),
        ("PATH", "/bin"),
    ]);
    assert_eq!(c.mem_limit[0], Some(4 * G));
    assert_eq!(c.mem_limit[1], Some(4 * G));
    assert_eq!(c.mem_limit[15], Some(2 * G));
    assert!(!c.mem_limit_malformed);
    assert_eq!(c.sm_limit, [100; 16]);
    assert_eq!(
        lines(&errs),
        [
            "CUDA_DEVICE_MEMORY_LIMIT_=\"1g\": \"\" is not a device index; write \
             CUDA_DEVICE_MEMORY_LIMIT_<i> with i from 0 to 15 in decimal, or \
             CUDA_DEVICE_MEMORY_LIMIT for every device; the value is ignored",
            "CUDA_DEVICE_MEMORY_LIMIT_01=\"1g\": \"01\" is not a device index; write \
             CUDA_DEVICE_MEMORY_LIMIT_<i> with i from 0 to 15 in decimal, or \
             CUDA_DEVICE_MEMORY_LIMIT for every device; the value is ignored",
            "CUDA_DEVICE_MEMORY_LIMIT_16=\"1g\" names device 16, but the shared region has \
             devices 0 to 15 only; the value is ignored",
            "CUDA_DEVICE_MEMORY_LIMIT_99=\"1g\" names device 99, but the shared region has \
             devices 0 to 15 only; the value is ignored",
            "CUDA_DEVICE_MEMORY_LIMIT_x=\"1g\": \"x\" is not a device index; write \
             CUDA_DEVICE_MEMORY_LIMIT_<i> with i from 0 to 15 in decimal, or \
             CUDA_DEVICE_MEMORY_LIMIT for every device; the value is ignored",
            "CUDA_DEVICE_SM_LIMIT_20=\"30\" names device 20, but the shared region has devices \
             0 to 15 only; the value is ignored",
        ]
    );
    assert!(errs.iter().all(|e| e.severity() == Severity::Error));
    // The per-device variables that are set are listed for the device-count check.
    assert_eq!(
        c.per_device_vars,
        [("CUDA_DEVICE_MEMORY_LIMIT_15".to_string(), 15)]
    );
    // A later pair wins, as the override file over the environment.
    let (c, _) = vars(&[
        ("CUDA_DEVICE_MEMORY_LIMIT", "1gbx"),
        ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
    ]);
    assert_eq!((c.mem_limit[0], c.mem_limit_malformed), (Some(G), false));
}

/// `HAMI_CONTEXT_SIZE` and `RECORD_KERNEL_INTERVAL` are read with the rest, so `/overrideEnv`
/// applies to them, and their messages say what really happens.
#[test]
fn context_size_and_kernel_interval() {
    let (c, errs) = cfg(&[]);
    assert_eq!((c.context_size, c.kernel_interval_s), (256 * M, 1));
    assert!(errs.is_empty());
    let (c, errs) = cfg(&[
        ("HAMI_CONTEXT_SIZE", "512MiB"),
        ("RECORD_KERNEL_INTERVAL", " 5 "),
    ]);
    assert_eq!((c.context_size, c.kernel_interval_s), (512 * M, 5));
    assert!(errs.is_empty());
    for v in ["lots", "99999999999999999999", "-1", "0"] {
        let (c, errs) = cfg(&[("HAMI_CONTEXT_SIZE", v)]);
        assert_eq!(c.context_size, 256 * M, "{v:?}");
        assert!(!c.mem_limit_malformed);
        assert_eq!(errs.len(), 1, "{v:?}");
        let line = errs[0].to_string();
        assert!(
            line.starts_with(&format!("HAMI_CONTEXT_SIZE={v:?}")),
            "{line}"
        );
        assert!(
            line.ends_with("; using the default context estimate of 256 MiB"),
            "{line}"
        );
        // 0 does not mean "no limit" here (issue 16, item 6).
        assert!(!line.contains("no limit"), "{line}");
    }
    let (_, errs) = cfg(&[("HAMI_CONTEXT_SIZE", "99999999999999999999")]);
    assert_eq!(
        lines(&errs),
        [
            "HAMI_CONTEXT_SIZE=\"99999999999999999999\" is not a size: it is larger than \
          18446744073709551615 bytes (16 EiB); write a smaller size; using the default context \
          estimate of 256 MiB"
        ]
    );
    for v in ["0", "-1", "1.5", "soon", ""] {
        let (c, errs) = cfg(&[("RECORD_KERNEL_INTERVAL", v)]);
        assert_eq!(c.kernel_interval_s, 1, "{v:?}");
        assert_eq!(
            lines(&errs),
            [format!(
                "RECORD_KERNEL_INTERVAL={v:?} is not a whole number of seconds (1 or more); \
                 using 1 second"
            )]
        );
        assert_eq!(errs[0].severity(), Severity::Warning);
    }
}

#[test]
fn sm_limits_table() {
    type Row<'a> = (&'a [(&'a str, &'a str)], [u64; 3], usize);
    let rows: &[Row] = &[
        (&[("CUDA_DEVICE_SM_LIMIT", "50")], [50; 3], 0),
        (&[("CUDA_DEVICE_SM_LIMIT", "0")], [100; 3], 0),
        (&[("CUDA_DEVICE_SM_LIMIT", "100")], [100; 3], 0),
        (&[("CUDA_DEVICE_SM_LIMIT", "0x19")], [25; 3], 0),
        (
            &[
                ("CUDA_DEVICE_SM_LIMIT", "50"),
                ("CUDA_DEVICE_SM_LIMIT_1", "20"),
            ],
            [50, 20, 50],
            0,
        ),
        (&[("CUDA_DEVICE_SM_LIMIT_2", "30")], [100, 100, 30], 0),
        (
            &[
                ("CUDA_DEVICE_SM_LIMIT", "50"),
                ("CUDA_DEVICE_SM_LIMIT_0", "0"),
            ],
            [100, 50, 50],
            1,
        ),
        (&[("CUDA_DEVICE_SM_LIMIT", "150")], [100; 3], 1),
        (&[("CUDA_DEVICE_SM_LIMIT", "50%")], [100; 3], 1),
        (
            &[
                ("CUDA_DEVICE_SM_LIMIT", "40"),
                ("CUDA_DEVICE_SM_LIMIT_1", "101"),
            ],
            [40; 3],
            1,
        ),
    ];
    for (vars, want, n_errs) in rows {
        let (c, errs) = cfg(vars);
        assert_eq!(&c.sm_limit[..3], want, "{vars:?}");
        assert_eq!(errs.len(), *n_errs, "{vars:?}: {:?}", lines(&errs));
    }
    let (_, errs) = cfg(&[("CUDA_DEVICE_SM_LIMIT", "150")]);
    assert_eq!(
        lines(&errs),
        ["CUDA_DEVICE_SM_LIMIT=\"150\" is not a percentage: 150 is more than 100 percent; write \
          a whole number from 0 to 100 (0 and 100 both mean no limit); the SM limit is not \
          applied"]
    );
}

#[test]
fn cache_path_priority_policy() {
    let (c, errs) = cfg(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/run/hami/x.cache")]);
    assert!(errs.is_empty());
    assert_eq!(c.cache_path, PathBuf::from("/run/hami/x.cache"));

    let (c, errs) = cfg(&[("CUDA_DEVICE_MEMORY_SHARED_CACHE", "")]);
    assert_eq!(c.cache_path, PathBuf::from(DEFAULT_CACHE_PATH));
    assert_eq!(
        lines(&errs),
        ["CUDA_DEVICE_MEMORY_SHARED_CACHE=\"\" is empty: set a file path or unset the variable; \
          using /tmp/cudevshr.cache"]
    );

    for (v, want, n) in [
        ("0", 0, 0),
        ("-2", -2, 0),
        (" 5 ", 5, 0),
        ("high", 1, 1),
        ("0x1", 1, 1),
    ] {
        let (c, errs) = cfg(&[("CUDA_TASK_PRIORITY", v)]);
        assert_eq!((c.priority, errs.len()), (want, n), "{v:?}");
    }
    let (_, errs) = cfg(&[("CUDA_TASK_PRIORITY", "high")]);
    assert!(errs[0]
        .to_string()
        .starts_with("CUDA_TASK_PRIORITY=\"high\" is not a priority: "));
    assert!(errs[0]
        .to_string()
        .ends_with("; using the default priority 1"));

    for (v, want, n) in [
        ("force", UtilPolicy::Force, 0),
        ("FORCE", UtilPolicy::Force, 0),
        ("disable", UtilPolicy::Disable, 0),
        ("DISABLE", UtilPolicy::Disable, 0),
        ("default", UtilPolicy::Default, 0),
        ("", UtilPolicy::Default, 0),
        ("Force", UtilPolicy::Default, 1),
        ("always", UtilPolicy::Default, 1),
    ] {
        let (c, errs) = cfg(&[("GPU_CORE_UTILIZATION_POLICY", v)]);
        assert_eq!((c.util_policy, errs.len()), (want, n), "{v:?}");
    }
    let (_, errs) = cfg(&[("GPU_CORE_UTILIZATION_POLICY", "always")]);
    assert_eq!(
        lines(&errs),
        [
            "GPU_CORE_UTILIZATION_POLICY=\"always\" is not a policy: write force, disable or \
          default; using default (the shared switch decides)"
        ]
    );
}

#[test]
fn visible_devices_table() {
    use VisibleDevice::{Index, Uuid};
    let u = |s: &str| Uuid(s.to_string());
    let rows: Vec<(&str, Vec<VisibleDevice>, usize)> = vec![
        ("0", vec![Index(0)], 0),
        ("1,0", vec![Index(1), Index(0)], 0),
        (" 2 , 3 ", vec![Index(2), Index(3)], 0),
        ("", vec![], 0),
        ("  ", vec![], 0),
        ("-1", vec![], 0),
        ("0,-1,1", vec![Index(0)], 0),
        (
            "GPU-8a3b1c2d-0000-1111-2222-333344445555,1",
            vec![u("GPU-8a3b1c2d-0000-1111-2222-333344445555"), Index(1)],
            0,
        ),
        ("MIG-GPU-abc/1/0", vec![u("MIG-GPU-abc/1/0")], 0),
        ("MIG-4f1e", vec![u("MIG-4f1e")], 0),
        ("0,foo,1", vec![Index(0)], 1),
        ("0,,1", vec![Index(0)], 1),
        ("GPU-", vec![], 1),
        ("1,99999999999", vec![Index(1)], 1),
    ];
    for (v, want, n) in rows {
        let (c, errs) = cfg(&[("CUDA_VISIBLE_DEVICES", v)]);
        assert_eq!(c.visible_devices.as_ref(), Some(&want), "{v:?}");
        assert_eq!(errs.len(), n, "{v:?}: {:?}", lines(&errs));
    }
    let (_, errs) = cfg(&[("CUDA_VISIBLE_DEVICES", "0,foo,1")]);
    assert_eq!(
        lines(&errs),
        [
            "CUDA_VISIBLE_DEVICES=\"0,foo,1\": entry \"foo\" is neither a device index nor a \
          GPU-/MIG- UUID; CUDA ignores it and every entry after it; the visible devices are 0"
        ]
    );
    assert_eq!(errs[0].severity(), Severity::Warning);
}

static TMP_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A file under the temp dir, removed on drop.
struct TempFile(PathBuf);
impl TempFile {
    fn with(contents: &[u8]) -> Self {
        let p = std::env::temp_dir().join(format!(
            "hami-config-test-{}-{}",
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&p, contents).unwrap();
        TempFile(p)
    }
}
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn override_file_table() {
    // (file text, expected pairs, number of warnings)
    type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], usize);
    let rows: &[Row] = &[
        ("", &[], 0),
        ("A=1\n", &[("A", "1")], 0),
        ("A=1\nB=x=y\n", &[("A", "1"), ("B", "x=y")], 0),
        ("A=1\r\nB=2\r\n", &[("A", "1"), ("B", "2")], 0),
        (
            "# comment\n\n  \nA=1\n   # indented comment\n",
            &[("A", "1")],
            0,
        ),
        // Upstream stops at the first line without '='; we skip it and continue.
        ("A=1\nGARBAGE\nB=2", &[("A", "1"), ("B", "2")], 1),
        ("=novalue\nB=2\n", &[("B", "2")], 1),
        (" KEY = v \n", &[("KEY", " v ")], 0),
        ("A=\n", &[("A", "")], 0),
        ("A=1\nA=2\n", &[("A", "1"), ("A", "2")], 0),
    ];
    for (text, want, n_warn) in rows {
        let f = TempFile::with(text.as_bytes());
        assert_eq!(read_override_file(&f.0), kv(want), "{text:?}");
        let (pairs, errs) = load_override_file(&f.0);
        assert_eq!(pairs, kv(want));
        assert_eq!(errs.len(), *n_warn, "{text:?}");
        assert!(errs.iter().all(|e| e.severity() == Severity::Warning));
    }
    let (_, errs) = parse_overrides("A=1\nGARBAGE\n", "/overrideEnv");
    assert_eq!(
        lines(&errs),
        ["/overrideEnv line 2 (\"GARBAGE\") has no \"=\"; write KEY=VALUE (HAMi-core would stop \
          reading the file here); the line is skipped"]
    );
    // Not UTF-8: replaced, not refused.
    let f = TempFile::with(b"A=\xff\n");
    assert_eq!(read_override_file(&f.0), kv(&[("A", "\u{fffd}")]));
}

#[test]
fn missing_or_unreadable_override_file() {
    let missing = std::env::temp_dir().join("hami-config-test-does-not-exist");
    assert!(read_override_file(&missing).is_empty());
    assert!(load_override_file(&missing).1.is_empty());
    // A directory cannot be read as a file: a warning, no pairs.
    let (pairs, errs) = load_override_file(&std::env::temp_dir());
    assert!(pairs.is_empty());
    assert_eq!(errs.len(), 1);
    assert!(matches!(
        errs[0].kind,
        ConfigErrorKind::OverrideUnreadable { .. }
    ));
}

#[test]
fn overrides_win_over_the_environment_without_setenv() {
    let before = std::env::var_os("CUDA_DEVICE_MEMORY_LIMIT_7");
    let f = TempFile::with(
        b"CUDA_DEVICE_MEMORY_LIMIT_7=3g\nCUDA_DEVICE_SM_LIMIT_7=10\nCUDA_DEVICE_SM_LIMIT_7=20\n",
    );
    let (c, errs) = Config::from_env_with_override_file(&f.0);
    assert_eq!(c.mem_limit[7], Some(3 * G));
    assert_eq!(
        c.sm_limit[7], 20,
        "the last duplicate wins, as successive setenv would"
    );
    assert!(
        !errs.iter().any(|e| e.var.ends_with("_7")),
        "{:?}",
        lines(&errs)
    );
    // The process environment is untouched.
    assert_eq!(std::env::var_os("CUDA_DEVICE_MEMORY_LIMIT_7"), before);
}

/// A malformed limit from the override file fails closed like one from the environment, and
/// the override file reaches `HAMI_CONTEXT_SIZE`, `RECORD_KERNEL_INTERVAL` and the per-device
/// name check too.
#[test]
fn malformed_limit_from_the_override_file_fails_closed() {
    let f = TempFile::with(
        b"CUDA_DEVICE_MEMORY_LIMIT_9=lots\nHAMI_CONTEXT_SIZE=96m\nRECORD_KERNEL_INTERVAL=7\n\
          CUDA_DEVICE_SM_LIMIT_42=10\n",
    );
    let (c, errs) = Config::from_env_with_override_file(&f.0);
    assert!(c.mem_limit_malformed);
    assert_eq!(c.mem_limit[9], None);
    assert_eq!((c.context_size, c.kernel_interval_s), (96 * M, 7));
    let shown = lines(&errs);
    assert!(
        shown.iter().any(|l| l.starts_with(
            "CUDA_DEVICE_MEMORY_LIMIT_9=\"lots\" is not a size: there is no number; "
        ) && l.ends_with(
            "this process gets no GPU memory (every allocation fails) until it is fixed"
        )),
        "{shown:?}"
    );
    assert!(
        shown
            .iter()
            .any(|l| l.starts_with("CUDA_DEVICE_SM_LIMIT_42=\"10\" names device 42")),
        "{shown:?}"
    );
}

/// A small deterministic generator (xorshift64*), since this crate has no proptest.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// Value pool: well-formed, zero, and malformed sizes.
const SIZES: &[&str] = &[
    "1g",
    "1GiB",
    "512Mi",
    "1gbx",
    "lots",
    "2G",
    "512m",
    "0x10m",
    "010m",
    "4096",
    "0",
    "1gb",
    "-1",
    "1.5g",
    "",
    "4 g",
    "08",
    "0x",
    "99999999999999999999",
    "17179869184g",
    " 3k ",
];

#[test]
fn per_device_precedence_through_from_lookup() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut seen_malformed = 0;
    for _ in 0..2000 {
        let mut map = HashMap::new();
        if rng.below(3) != 0 {
            map.insert(MEMORY_LIMIT.to_string(), rng.pick(SIZES).to_string());
        }
        for i in 0..MAX_DEVICES {
            if rng.below(2) == 0 {
                map.insert(format!("{MEMORY_LIMIT}_{i}"), rng.pick(SIZES).to_string());
            }
        }
        let (c, _) = Config::from_lookup(|k| map.get(k).cloned());
        let mut any_malformed = false;
        for i in 0..MAX_DEVICES {
            // The per-device variable decides when set, else the global one; as written.
            let decider = map
                .get(&format!("{MEMORY_LIMIT}_{i}"))
                .or_else(|| map.get(MEMORY_LIMIT));
            let parsed = decider.map(|v| hami_shm::envparse::parse_size(v).ok());
            any_malformed |= matches!(parsed, Some(None));
            let want = parsed.flatten().filter(|&n| n != 0);
            assert_eq!(c.mem_limit[i], want, "device {i}, env {map:?}");
        }
        assert_eq!(c.mem_limit_malformed, any_malformed, "env {map:?}");
        seen_malformed += usize::from(any_malformed);
    }
    assert!(seen_malformed > 100, "the pool exercises malformed values");
}
