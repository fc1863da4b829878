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
//! - `CUDA_DEVICE_MEMORY_LIMIT_<i>` (i = 0..15) wins over `CUDA_DEVICE_MEMORY_LIMIT`. Sizes
//!   ([`hami_shm::envparse::parse_size`]) are HAMi-core's (`1g`, `1024m`, `0x...`, leading-`0`
//!   octal: `010m` is 8 MiB) plus the unit spellings people write (`1gb`, `1GB`, `1GiB`, `1Gi`,
//!   `1024MiB`, `512Mi`, `1tb`, `1KiB`, ...), **all 1024-based** (`1GB` = 2³⁰ bytes), as HAMi-core's
//!   `g`/`m`/`k` are. 0 means no limit, with a warning, as upstream.
//! - **A malformed memory limit fails closed.** The variable that decides a device's limit (its
//!   `_<i>` variable when set, else the global one) is used as written: when it does not parse
//!   (`1gbx`, `-1`, empty, `lots`, `1.5g`, more than 16 EiB) there is no fallback to the other
//!   variable and never "no limit"; [`Config::mem_limit_malformed`] is set, the process gets no
//!   GPU memory and does not initialise the region, and one error line names the variable, the
//!   value and what to write. Upstream silently uses a misread number instead (`1gbx` = 1 byte,
//!   `1.5g` = 1 GiB, `-1` = 16 EiB, an overflow = no limit), and in its first process that
//!   number becomes the region's limit for everyone.
//! - A `CUDA_DEVICE_MEMORY_LIMIT_<n>` or `CUDA_DEVICE_SM_LIMIT_<n>` whose suffix is not a device
//!   index 0..15 in decimal (`_16`, `_99`, `_x`, `_01`) is ignored with an error line
//!   ([`Config::from_vars`], which sees every name). An index in range that names no device of
//!   this process is reported once the driver's device count is known (`hooks::devices`).
//! - `CUDA_DEVICE_SM_LIMIT[_<i>]`: percent, same precedence; unset or 0 means 100 (no limit);
//!   above 100 or malformed is refused with an error line and counts as unset (the SM limit
//!   shares time, so it does not fail closed).
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
//! - `HAMI_CONTEXT_SIZE` (ours): a size, what a context counts where NVML cannot measure it,
//!   default 256 MiB; malformed → error, 0 → warning, the default is used.
//! - `RECORD_KERNEL_INTERVAL`: whole seconds between two updates of the region's
//!   `last_kernel_time`, default 1; anything else (0 included) → warning, 1 is used.
//!
//! `/overrideEnv` ([`OVERRIDE_FILE`]) holds `KEY=VALUE` lines that upstream applies with
//! `setenv(KEY, VALUE, 1)`. **We never modify the process environment**: the entries are layered
//! into the lookup instead, winning over the environment exactly as an overwriting `setenv` would
//! (and, among duplicates, the last line wins). See [`parse_overrides`] for the line syntax.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use hami_shm::envparse::{self, Expected, MemLimit, ParseError, Problem};

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
/// Set to `true` by HAMi's device plugin when device memory scaling exceeds 1.
pub const OVERSUBSCRIBE: &str = "CUDA_OVERSUBSCRIBE";
/// The device visibility variable (CUDA's own).
pub const VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// The context estimate variable (ours; see `hooks::context`).
pub const CONTEXT_SIZE: &str = "HAMI_CONTEXT_SIZE";
/// The kernel-time recording interval variable.
pub const KERNEL_INTERVAL: &str = "RECORD_KERNEL_INTERVAL";

/// What a context counts where NVML cannot measure it and `HAMI_CONTEXT_SIZE` is unset.
const DEFAULT_CONTEXT_SIZE: u64 = 256 << 20;

/// `RECORD_KERNEL_INTERVAL` when unset, in seconds, as in HAMi-core.
const DEFAULT_KERNEL_INTERVAL_S: u64 = 1;

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
    /// Memory limit per device in bytes, from well-formed values only; `None` = unlimited (or,
    /// for a device whose deciding variable is malformed, nothing valid: see
    /// [`Config::mem_limit_malformed`]).
    pub mem_limit: [Option<u64>; MAX_DEVICES],
    /// A memory-limit variable that decides some device's limit is malformed. The runtime then
    /// refuses every allocation and does not initialise the region: a typo must never become
    /// "no limit", for this process or, through the region, for everyone.
    pub mem_limit_malformed: bool,
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
    /// The per-device limit variables set (memory and SM) with their device index, so the
    /// hooks can name those that no device of this process has once the count is known.
    pub per_device_vars: Vec<(String, usize)>,
    /// `HAMI_CONTEXT_SIZE`: what a context counts where NVML cannot measure it, in bytes.
    pub context_size: u64,
    /// `RECORD_KERNEL_INTERVAL`, in seconds (at least 1).
    pub kernel_interval_s: u64,
    /// `CUDA_OVERSUBSCRIBE=true` (HAMi sets it when its memory scaling exceeds 1, so a limit may
    /// exceed the GPU): NVML and `cuDeviceTotalMem` then report the limit as the total, as
    /// HAMi-core does (docs/monitor-contract.md).
    pub oversubscribe: bool,
}

impl Default for Config {
    /// The configuration of an empty environment: no limits, HAMi-core's defaults.
    fn default() -> Self {
        Self {
            mem_limit: [None; MAX_DEVICES],
            mem_limit_malformed: false,
            sm_limit: [100; MAX_DEVICES],
            cache_path: PathBuf::from(DEFAULT_CACHE_PATH),
            priority: DEFAULT_PRIORITY,
            util_policy: UtilPolicy::Default,
            visible_devices: None,
            per_device_vars: Vec::new(),
            context_size: DEFAULT_CONTEXT_SIZE,
            kernel_interval_s: DEFAULT_KERNEL_INTERVAL_S,
            oversubscribe: false,
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
    /// A per-device limit variable whose suffix is not a device index 0..15 in decimal; it is
    /// ignored (an error). `var` holds the whole name.
    BadDeviceSuffix {
        /// The variable it was meant to be a per-device form of.
        base: &'static str,
    },
    /// `HAMI_CONTEXT_SIZE=0`: a context cannot cost nothing; the default is used (a warning).
    ZeroContextSize,
    /// `RECORD_KERNEL_INTERVAL` is not a whole number of seconds, at least 1 (a warning).
    NotSeconds,
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
            | ConfigErrorKind::BadDeviceSuffix { .. }
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
            ConfigErrorKind::BadDeviceSuffix { base } => {
                let suffix = var.strip_prefix(base).unwrap_or(var);
                let suffix = suffix.strip_prefix('_').unwrap_or(suffix);
                match suffix.parse::<u64>() {
                    Ok(n) if n >= MAX_DEVICES as u64 && !suffix.starts_with('0') => write!(
                        f,
                        "{var}={value:?} names device {n}, but the shared region has devices 0 \
                         to {} only",
                        MAX_DEVICES - 1
                    )?,
                    _ => write!(
                        f,
                        "{var}={value:?}: {suffix:?} is not a device index; write {base}_<i> \
                         with i from 0 to {} in decimal, or {base} for every device",
                        MAX_DEVICES - 1
                    )?,
                }
            }
            ConfigErrorKind::ZeroContextSize => write!(
                f,
                "{var}={value:?}: a context cannot be estimated at 0 bytes; unset it for the \
                 default, or write a size such as 512m"
            )?,
            ConfigErrorKind::NotSeconds => write!(
                f,
                "{var}={value:?} is not a whole number of seconds (1 or more)"
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

/// What a malformed memory limit means for this process, said in its error line.
const NO_MEMORY: &str =
    "this process gets no GPU memory (every allocation fails) until it is fixed";

fn per_device(base: &str, i: usize) -> String {
    format!("{base}_{i}")
}

impl Config {
    /// Resolves the configuration from `lookup` (a variable's value, `None` when unset), returning
    /// it with every problem found, in a stable order. Pure: no environment, no logging.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> (Config, Vec<ConfigError>) {
        let mut cfg = Config::default();
        let mut errs = Vec::new();

        // Memory limits: the deciding variable is used as written (module docs).
        let global = lookup(MEMORY_LIMIT);
        let per: [Option<String>; MAX_DEVICES] =
            std::array::from_fn(|i| lookup(&per_device(MEMORY_LIMIT, i)));
        match global.as_deref().map(|v| (v, envparse::parse_size(v))) {
            Some((_, Err(e))) => {
                let outcome = if per.iter().any(Option::is_none) {
                    NO_MEMORY
                } else {
                    "every device has its own limit variable, so it applies to none"
                };
                errs.push(ConfigError::malformed(MEMORY_LIMIT, &e, outcome));
            }
            Some((v, Ok(0))) => errs.push(ConfigError::new(
                MEMORY_LIMIT,
                v,
                ConfigErrorKind::ZeroMeansUnlimited,
                "no memory limit is applied",
            )),
            _ => {}
        }
        for (i, value) in per.iter().enumerate() {
            let name = per_device(MEMORY_LIMIT, i);
            if let Some(v) = value.as_deref() {
                cfg.per_device_vars.push((name.clone(), i));
                match envparse::parse_size(v) {
                    Err(e) => errs.push(ConfigError::malformed(&name, &e, NO_MEMORY)),
                    Ok(0) => errs.push(ConfigError::new(
                        &name,
                        v,
                        ConfigErrorKind::ZeroMeansUnlimited,
                        format!("device {i} has no memory limit"),
                    )),
                    Ok(_) => {}
                }
            }
            match envparse::device_memory_limit(value.as_deref(), global.as_deref()).0 {
                MemLimit::Bytes(n) => cfg.mem_limit[i] = Some(n),
                MemLimit::Unlimited => {}
                MemLimit::Malformed => cfg.mem_limit_malformed = true,
            }
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
                cfg.per_device_vars.push((name.clone(), i));
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

        // Oversubscription: HAMi writes "true"; anything else leaves the views capped.
        cfg.oversubscribe = lookup(OVERSUBSCRIBE)
            .is_some_and(|v| matches!(v.trim(), "true" | "TRUE" | "True" | "1"));

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

        // Context estimate.
        if let Some(v) = lookup(CONTEXT_SIZE) {
            let default = format!(
                "using the default context estimate of {} MiB",
                DEFAULT_CONTEXT_SIZE >> 20
            );
            match envparse::parse_size(&v) {
                Ok(0) => errs.push(ConfigError::new(
                    CONTEXT_SIZE,
                    &v,
                    ConfigErrorKind::ZeroContextSize,
                    default,
                )),
                Ok(n) => cfg.context_size = n,
                Err(e) => errs.push(ConfigError::malformed(CONTEXT_SIZE, &e, default)),
            }
        }

        // Kernel-time interval.
        if let Some(v) = lookup(KERNEL_INTERVAL) {
            match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => cfg.kernel_interval_s = n,
                _ => errs.push(ConfigError::new(
                    KERNEL_INTERVAL,
                    &v,
                    ConfigErrorKind::NotSeconds,
                    format!("using {DEFAULT_KERNEL_INTERVAL_S} second"),
                )),
            }
        }

        (cfg, errs)
    }

    /// [`Config::from_lookup`] over a whole environment, given as `(NAME, VALUE)` pairs (a later
    /// pair wins over an earlier one of the same name), plus what only the whole list shows:
    /// per-device limit variables whose suffix is not a device index (errors, sorted by name,
    /// after the others).
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> (Config, Vec<ConfigError>) {
        let map: HashMap<String, String> = vars.into_iter().collect();
        let (cfg, mut errs) = Config::from_lookup(|name| map.get(name).cloned());
        let mut stray: Vec<ConfigError> = map
            .iter()
            .filter_map(|(name, value)| {
                let base = [MEMORY_LIMIT, SM_LIMIT]
                    .into_iter()
                    .find(|b| name.strip_prefix(b).is_some_and(|r| r.starts_with('_')))?;
                let index_ok = (0..MAX_DEVICES).any(|i| *name == per_device(base, i));
                (!index_ok).then(|| {
                    ConfigError::new(
                        name,
                        value,
                        ConfigErrorKind::BadDeviceSuffix { base },
                        "the value is ignored",
                    )
                })
            })
            .collect();
        stray.sort_by(|a, b| a.var.cmp(&b.var));
        errs.extend(stray);
        (cfg, errs)
    }

    /// Reads the configuration of this process: [`OVERRIDE_FILE`] layered over the environment
    /// (see the module docs; the environment itself is not modified), then
    /// [`Config::from_vars`]. Returns the override file's warnings first, then the variables'
    /// problems; the caller logs them.
    pub fn from_process_env() -> (Config, Vec<ConfigError>) {
        Self::from_env_with_override_file(Path::new(OVERRIDE_FILE))
    }

    /// [`Config::from_process_env`] with another override file, for tools and tests.
    pub fn from_env_with_override_file(path: &Path) -> (Config, Vec<ConfigError>) {
        let (overrides, mut errs) = load_override_file(path);
        let env = std::env::vars_os().map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        });
        let (cfg, more) = Config::from_vars(env.chain(overrides));
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
