//! The library's configuration, read from the environment with HAMi-core's meanings and
//! explicit errors.
//!
//! [`Config::from_lookup`] is pure: it takes a lookup function, so tests (and tools) can feed any
//! environment. [`Config::from_process_env`] layers `/overrideEnv` over the process environment
//! and calls it. Neither logs; the caller reports the returned [`ConfigError`]s (see
//! [`log_diagnostics`]) once it is safe to log.
//!
//! Semantics, variable by variable:
//!
//! - `CUDA_DEVICE_MEMORY_LIMIT_<i>` (i = 0..15) wins over `CUDA_DEVICE_MEMORY_LIMIT`; sizes use
//!   HAMi-core's syntax ([`hami_shm::envparse::parse_size`]: `1g`, `1024m`, `0x...`, leading-`0`
//!   octal). 0 means no limit, with a warning, as upstream. A **malformed value is an error and
//!   counts as unset**: for a per-device variable the global one then applies to that device; for
//!   the global one (or a per-device one with no usable global) the device gets **no limit** and
//!   the error line says so ("the limit is not applied"). Upstream would instead silently use a
//!   misread number (`1gb` = 1 byte, `1.5g` = 1 GiB, `-1` = 16 EiB).
//! - `CUDA_DEVICE_SM_LIMIT[_<i>]`: percent, same precedence; unset or 0 means 100 (no limit);
//!   above 100 is refused (error, counts as unset).
//! - `CUDA_DEVICE_MEMORY_SHARED_CACHE`: the region file, default `/tmp/cudevshr.cache`; an empty
//!   value is an error and the default is used.
//! - `CUDA_TASK_PRIORITY`: a decimal integer, default 1; malformed → error, default used.
//! - `GPU_CORE_UTILIZATION_POLICY`: `force`/`FORCE`, `disable`/`DISABLE`, `default`/`DEFAULT` or
//!   unset (an empty value also means default, silently); anything else → [`UtilPolicy::Default`]
//!   plus an error (upstream also falls back to default, silently).
//! - `CUDA_VISIBLE_DEVICES`: unset → `None` (all devices); otherwise comma-separated entries,
//!   each trimmed: a decimal index or a UUID starting `GPU-` or `MIG-`. An empty value means no
//!   devices (`Some(vec![])`). The first invalid entry ends the list, as in CUDA, which ignores
//!   everything from the first invalid entry on (so `-1` hides every device); a warning names it
//!   unless it is a negative number, the usual way to hide all GPUs.
//!
//! `/overrideEnv` ([`OVERRIDE_FILE`]) holds `KEY=VALUE` lines that upstream applies with
//! `setenv(KEY, VALUE, 1)`. **We never modify the process environment**: the entries are layered
//! into the lookup instead, winning over the environment exactly as an overwriting `setenv` would
//! (and, among duplicates, the last line wins). See [`parse_overrides`] for the line syntax.

use std::fmt;
use std::path::{Path, PathBuf};

use hami_shm::envparse::{self, Expected, ParseError, Problem};

/// Number of devices with their own limit variables (`_0` .. `_15`), the region's device count.
pub const MAX_DEVICES: usize = hami_shm::layout::ABI_DEVS;

/// The region file used when `CUDA_DEVICE_MEMORY_SHARED_CACHE` is unset, as in HAMi-core.
pub const DEFAULT_CACHE_PATH: &str = "/tmp/cudevshr.cache";

/// The priority used when `CUDA_TASK_PRIORITY` is unset, as in HAMi-core.
pub const DEFAULT_PRIORITY: i32 = 1;

/// The override file HAMi's device plugin may mount, read by [`Config::from_process_env`].
pub const OVERRIDE_FILE: &str = "/overrideEnv";

/// The global memory limit variable.
pub const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// The global SM limit variable.
pub const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// The region file variable.
pub const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// The task priority variable.
pub const TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
/// The SM utilisation policy variable.
pub const UTIL_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
/// The device visibility variable (CUDA's own).
pub const VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// `GPU_CORE_UTILIZATION_POLICY`: whether the SM limit is enforced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UtilPolicy {
    /// The region's shared switch decides (set by HAMi's monitor).
    #[default]
    Default,
    /// Always limit, even a lone task.
    Force,
    /// Never limit.
    Disable,
}

/// One entry of `CUDA_VISIBLE_DEVICES`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VisibleDevice {
    /// A device ordinal, e.g. `1`.
    Index(u32),
    /// A device UUID as written, e.g. `GPU-8a3b...` or `MIG-...`.
    Uuid(String),
}

/// Everything the library reads from its environment, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Memory limit per device in bytes; `None` = unlimited.
    pub mem_limit: [Option<u64>; MAX_DEVICES],
    /// SM limit per device in percent; 100 = unlimited.
    pub sm_limit: [u64; MAX_DEVICES],
    /// The shared region file.
    pub cache_path: PathBuf,
    /// `CUDA_TASK_PRIORITY`, stored in the region for HAMi's monitor.
    pub priority: i32,
    /// `GPU_CORE_UTILIZATION_POLICY`.
    pub util_policy: UtilPolicy,
    /// `CUDA_VISIBLE_DEVICES`; `None` when unset (all devices visible).
    pub visible_devices: Option<Vec<VisibleDevice>>,
}

impl Default for Config {
    /// The configuration of an empty environment: no limits, HAMi-core's defaults.
    fn default() -> Self {
        Self {
            mem_limit: [None; MAX_DEVICES],
            sm_limit: [100; MAX_DEVICES],
            cache_path: PathBuf::from(DEFAULT_CACHE_PATH),
            priority: DEFAULT_PRIORITY,
            util_policy: UtilPolicy::Default,
            visible_devices: None,
        }
    }
}

/// How serious a [`ConfigError`] is, which picks the log level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Legal but probably not what was meant (e.g. a limit of 0).
    Warning,
    /// The value was refused; a fallback is in effect.
    Error,
}

/// What was wrong with one variable (or override line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigErrorKind {
    /// The value does not parse; `problem` says why (see [`hami_shm::envparse::Problem`]).
    Malformed {
        /// What the value should have been.
        expected: Expected,
        /// Why it is not.
        problem: Problem,
    },
    /// A memory limit of 0, which means no limit (a warning, as upstream).
    ZeroMeansUnlimited,
    /// `CUDA_DEVICE_SM_LIMIT_<i>=0`: no SM limit on that device (a warning).
    ZeroSmMeansUnlimited,
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE` is empty.
    EmptyPath,
    /// `GPU_CORE_UTILIZATION_POLICY` is not one of the known words.
    UnknownPolicy,
    /// An entry of `CUDA_VISIBLE_DEVICES` is neither an index nor a UUID; it and the entries
    /// after it are ignored (a warning).
    InvalidVisibleDevice {
        /// The offending entry, trimmed.
        entry: String,
        /// How many entries before it were kept.
        kept: usize,
    },
    /// A non-blank, non-comment line of the override file has no `=` or nothing before it; it
    /// is skipped (a warning). `var` holds the file, `value` the line.
    BadOverrideLine {
        /// 1-based line number.
        line: usize,
    },
    /// The override file exists but could not be read (a warning); no overrides apply.
    OverrideUnreadable {
        /// The I/O error, as text.
        error: String,
    },
}

/// One problem found in the configuration: the variable, its value, what was wrong and what
/// happens instead. `Display` is one line, e.g. `CUDA_DEVICE_MEMORY_LIMIT="1gb" is not a size:
/// unknown suffix "gb"; write 1g (GiB), 1024m (MiB), 512k (KiB) or plain bytes; the limit is not
/// applied`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The variable's name (or the override file's path).
    pub var: String,
    /// Its value as found (or the override line).
    pub value: String,
    /// What was wrong.
    pub kind: ConfigErrorKind,
    /// What is done instead, e.g. "the limit is not applied".
    pub outcome: String,
}

impl ConfigError {
    fn new(var: &str, value: &str, kind: ConfigErrorKind, outcome: impl Into<String>) -> Self {
        Self {
            var: var.to_owned(),
            value: value.to_owned(),
            kind,
            outcome: outcome.into(),
        }
    }

    fn malformed(var: &str, e: &ParseError<'_>, outcome: impl Into<String>) -> Self {
        Self::new(
            var,
            e.input(),
            ConfigErrorKind::Malformed {
                expected: e.expected(),
                problem: e.problem(),
            },
            outcome,
        )
    }

    /// Whether this is a refused value (error) or a legal but suspicious one (warning).
    pub fn severity(&self) -> Severity {
        match self.kind {
            ConfigErrorKind::Malformed { .. }
            | ConfigErrorKind::EmptyPath
            | ConfigErrorKind::UnknownPolicy => Severity::Error,
            _ => Severity::Warning,
        }
    }

    /// Logs this line at its severity.
    pub fn log(&self) {
        match self.severity() {
            Severity::Error => crate::log::log_error!("{self}"),
            Severity::Warning => crate::log::log_warn!("{self}"),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (var, value) = (&self.var, &self.value);
        match &self.kind {
            ConfigErrorKind::Malformed { expected, problem } => write!(
                f,
                "{var}={}",
                ParseError::from_parts(value, *expected, *problem)
            )?,
            ConfigErrorKind::ZeroMeansUnlimited => write!(
                f,
                "{var}={value:?} means no memory limit; unset it to say so, or write a size such \
                 as 4g"
            )?,
            ConfigErrorKind::ZeroSmMeansUnlimited => write!(
                f,
                "{var}={value:?} means no SM limit; write 1 to 100, or unset it"
            )?,
            ConfigErrorKind::EmptyPath => write!(
                f,
                "{var}={value:?} is empty: set a file path or unset the variable"
            )?,
            ConfigErrorKind::UnknownPolicy => {
                write!(
                    f,
                    "{var}={value:?} is not a policy: write force, disable or default"
                )?;
                let lower = value.trim().to_ascii_lowercase();
                if ["force", "disable", "default"].contains(&lower.as_str()) {
                    write!(f, " (all lower or all upper case)")?;
                }
            }
            ConfigErrorKind::InvalidVisibleDevice { entry, .. } => write!(
                f,
                "{var}={value:?}: entry {entry:?} is neither a device index nor a GPU-/MIG- \
                 UUID; CUDA ignores it and every entry after it"
            )?,
            ConfigErrorKind::BadOverrideLine { line } => {
                if value.contains('=') {
                    write!(
                        f,
                        "{var} line {line} ({value:?}) has no name before \"=\"; write KEY=VALUE"
                    )?
                } else {
                    write!(
                        f,
                        "{var} line {line} ({value:?}) has no \"=\"; write KEY=VALUE (HAMi-core \
                         would stop reading the file here)"
                    )?
                }
            }
            ConfigErrorKind::OverrideUnreadable { error } => {
                write!(f, "{var} cannot be read: {error}")?
            }
        }
        write!(f, "; {}", self.outcome)
    }
}

impl std::error::Error for ConfigError {}

/// Logs every diagnostic, errors with `log_error!`, warnings with `log_warn!`.
pub fn log_diagnostics(errors: &[ConfigError]) {
    for e in errors {
        e.log();
    }
}

fn per_device(base: &str, i: usize) -> String {
    format!("{base}_{i}")
}

impl Config {
    /// Resolves the configuration from `lookup` (a variable's value, `None` when unset), returning
    /// it with every problem found, in a stable order. Pure: no environment, no logging.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> (Config, Vec<ConfigError>) {
        let mut cfg = Config::default();
        let mut errs = Vec::new();

        // Memory limits.
        let global = lookup(MEMORY_LIMIT);
        let global_ok = match global.as_deref().map(|v| (v, envparse::parse_size(v))) {
            Some((_, Err(e))) => {
                errs.push(ConfigError::malformed(
                    MEMORY_LIMIT,
                    &e,
                    "the limit is not applied",
                ));
                false
            }
            Some((v, Ok(0))) => {
                errs.push(ConfigError::new(
                    MEMORY_LIMIT,
                    v,
                    ConfigErrorKind::ZeroMeansUnlimited,
                    "no memory limit is applied",
                ));
                true
            }
            Some((_, Ok(_))) => true,
            None => false,
        };
        for i in 0..MAX_DEVICES {
            let name = per_device(MEMORY_LIMIT, i);
            let value = lookup(&name);
            if let Some(v) = value.as_deref() {
                match envparse::parse_size(v) {
                    Err(e) => {
                        let outcome = if global_ok {
                            format!("the value is ignored and {MEMORY_LIMIT} applies to device {i}")
                        } else {
                            format!("the limit is not applied (device {i} has no memory limit)")
                        };
                        errs.push(ConfigError::malformed(&name, &e, outcome));
                    }
                    Ok(0) => errs.push(ConfigError::new(
                        &name,
                        v,
                        ConfigErrorKind::ZeroMeansUnlimited,
                        format!("device {i} has no memory limit"),
                    )),
                    Ok(_) => {}
                }
            }
            cfg.mem_limit[i] = envparse::device_memory_limit(value.as_deref(), global.as_deref()).0;
        }

        // SM limits.
        let global = lookup(SM_LIMIT);
        let global_ok = match global.as_deref().map(envparse::parse_percent) {
            Some(Err(e)) => {
                errs.push(ConfigError::malformed(
                    SM_LIMIT,
                    &e,
                    "the SM limit is not applied",
                ));
                false
            }
            Some(Ok(_)) => true,
            None => false,
        };
        for i in 0..MAX_DEVICES {
            let name = per_device(SM_LIMIT, i);
            let value = lookup(&name);
            if let Some(v) = value.as_deref() {
                match envparse::parse_percent(v) {
                    Err(e) => {
                        let outcome = if global_ok {
                            format!("the value is ignored and {SM_LIMIT} applies to device {i}")
                        } else {
                            format!("the SM limit is not applied (device {i} has no SM limit)")
                        };
                        errs.push(ConfigError::malformed(&name, &e, outcome));
                    }
                    Ok(0) => errs.push(ConfigError::new(
                        &name,
                        v,
                        ConfigErrorKind::ZeroSmMeansUnlimited,
                        format!("device {i} has no SM limit"),
                    )),
                    Ok(_) => {}
                }
            }
            cfg.sm_limit[i] = envparse::device_sm_limit(value.as_deref(), global.as_deref()).0;
        }

        // Region file.
        if let Some(p) = lookup(SHARED_CACHE) {
            if p.trim().is_empty() {
                errs.push(ConfigError::new(
                    SHARED_CACHE,
                    &p,
                    ConfigErrorKind::EmptyPath,
                    format!("using {DEFAULT_CACHE_PATH}"),
                ));
            } else {
                cfg.cache_path = PathBuf::from(p);
            }
        }

        // Priority.
        if let Some(v) = lookup(TASK_PRIORITY) {
            match envparse::parse_priority(&v) {
                Ok(p) => cfg.priority = p,
                Err(e) => errs.push(ConfigError::malformed(
                    TASK_PRIORITY,
                    &e,
                    format!("using the default priority {DEFAULT_PRIORITY}"),
                )),
            }
        }

        // Utilisation policy.
        if let Some(v) = lookup(UTIL_POLICY) {
            cfg.util_policy = match v.as_str() {
                "force" | "FORCE" => UtilPolicy::Force,
                "disable" | "DISABLE" => UtilPolicy::Disable,
                "default" | "DEFAULT" | "" => UtilPolicy::Default,
                _ => {
                    errs.push(ConfigError::new(
                        UTIL_POLICY,
                        &v,
                        ConfigErrorKind::UnknownPolicy,
                        "using default (the shared switch decides)",
                    ));
                    UtilPolicy::Default
                }
            };
        }

        // Visible devices.
        if let Some(v) = lookup(VISIBLE_DEVICES) {
            let (list, bad) = parse_visible_devices(&v);
            if let Some(entry) = bad {
                let kept = list.len();
                let shown: Vec<String> = list
                    .iter()
                    .map(|d| match d {
                        VisibleDevice::Index(i) => i.to_string(),
                        VisibleDevice::Uuid(u) => u.clone(),
                    })
                    .collect();
                let outcome = if kept == 0 {
                    "no device is visible".to_owned()
                } else {
                    format!("the visible devices are {}", shown.join(","))
                };
                errs.push(ConfigError::new(
                    VISIBLE_DEVICES,
                    &v,
                    ConfigErrorKind::InvalidVisibleDevice { entry, kept },
                    outcome,
                ));
            }
            cfg.visible_devices = Some(list);
        }

        (cfg, errs)
    }

    /// Reads the configuration of this process: [`OVERRIDE_FILE`] layered over the environment
    /// (see the module docs; the environment itself is not modified), then
    /// [`Config::from_lookup`]. Returns the override file's warnings first, then the variables'
    /// problems; the caller logs them.
    pub fn from_process_env() -> (Config, Vec<ConfigError>) {
        Self::from_env_with_override_file(Path::new(OVERRIDE_FILE))
    }

    /// [`Config::from_process_env`] with another override file, for tools and tests.
    pub fn from_env_with_override_file(path: &Path) -> (Config, Vec<ConfigError>) {
        let (overrides, mut errs) = load_override_file(path);
        let (cfg, more) = Config::from_lookup(|name| {
            overrides
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
        });
        errs.extend(more);
        (cfg, errs)
    }
}

/// Parses a `CUDA_VISIBLE_DEVICES` value: the entries up to the first invalid one, and that
/// invalid entry (trimmed) when it should be reported. An empty (or blank) value is an empty list.
/// A negative number as the invalid entry (`-1`) is CUDA's idiom for "no devices" and is not
/// reported.
pub fn parse_visible_devices(value: &str) -> (Vec<VisibleDevice>, Option<String>) {
    let mut out = Vec::new();
    if value.trim().is_empty() {
        return (out, None);
    }
    for entry in value.split(',') {
        let entry = entry.trim();
        let parsed = if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            entry.parse::<u32>().ok().map(VisibleDevice::Index)
        } else if (entry.starts_with("GPU-") || entry.starts_with("MIG-")) && entry.len() > 4 {
            Some(VisibleDevice::Uuid(entry.to_owned()))
        } else {
            None
        };
        match parsed {
            Some(d) => out.push(d),
            None => {
                let hide_all_idiom = entry.parse::<i64>().is_ok_and(|n| n < 0);
                return (out, (!hide_all_idiom).then(|| entry.to_owned()));
            }
        }
    }
    (out, None)
}

/// Parses the text of an override file into `(KEY, VALUE)` pairs in file order, with a warning
/// for each skipped line. `source` names the file in the warnings.
///
/// A line is `KEY=VALUE`, split at the first `=`; the key is trimmed, the value is kept as written
/// (only the line ending, `\n` or `\r\n`, is removed). Blank lines and lines whose first
/// non-blank character is `#` are skipped silently. A line without `=`, or with an empty key, is
/// skipped with a warning and reading continues — upstream instead stops reading at the first line
/// without `=` (a blank line included), which silently drops every later override.
pub fn parse_overrides(text: &str, source: &str) -> (Vec<(String, String)>, Vec<ConfigError>) {
    let mut pairs = Vec::new();
    let mut errs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                pairs.push((k.trim().to_owned(), v.to_owned()));
            }
            _ => errs.push(ConfigError::new(
                source,
                line,
                ConfigErrorKind::BadOverrideLine { line: n + 1 },
                "the line is skipped",
            )),
        }
    }
    (pairs, errs)
}

/// Reads an override file: its pairs and the warnings about it. A missing file is normal (no
/// overrides, no warning); an unreadable one is a warning. Bytes that are not UTF-8 are replaced.
pub fn load_override_file(path: &Path) -> (Vec<(String, String)>, Vec<ConfigError>) {
    let shown = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => parse_overrides(&String::from_utf8_lossy(&bytes), &shown),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Vec::new(), Vec::new()),
        Err(e) => (
            Vec::new(),
            vec![ConfigError::new(
                &shown,
                "",
                ConfigErrorKind::OverrideUnreadable {
                    error: e.to_string(),
                },
                "no overrides are applied",
            )],
        ),
    }
}

/// Reads an override file into `(KEY, VALUE)` pairs, logging a warning for each skipped line
/// (see [`parse_overrides`]); a missing file gives no pairs. For callers, like `shrreg-tool
/// --create_new`, that want the pairs and no diagnostics to handle.
pub fn read_override_file(path: &Path) -> Vec<(String, String)> {
    let (pairs, errs) = load_override_file(path);
    log_diagnostics(&errs);
    pairs
}
